"""The training thread's inbox: the records it hands to the agent thread.

The training thread appends one small record per event to a bounded deque (O(1), no lock,
nothing read off a device); the agent thread drains it every tick. On every step the records
are plain tuples (``hot_path``: a step's end, ``mon.log``'s scalars, the loss ``bsmon run``
saw), which cost no constructor call; ``Telemetry.drain`` takes them in a tick's worth at a
time. It takes the records it knows (those tuples, ``Event``, ``Flush``); any other record goes to
the extensions (``Extension.on_record``), for instance a ``BatchChange`` for batch control.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

CAPACITY = 1 << 16


@dataclass(frozen=True, slots=True)
class Flush:
    """Set ``done`` once everything before this record is processed and sent."""

    done: threading.Event


def make_inbox() -> deque[Any]:
    return deque(maxlen=CAPACITY)
