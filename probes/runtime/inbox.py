"""The training thread's inbox: the records it hands to the agent thread.

The training thread appends one small record per event to a bounded deque (O(1), no lock,
nothing read off a device); the agent thread drains it every tick. ``Telemetry`` takes the
records it knows (``StepEnded``, ``Logged``, ``Event``, ``Flush``); any other record goes to
the extensions (``Extension.on_record``), for instance a ``BatchChange`` for batch control.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

from ..anatomy.marks import StepMarks
from .timing import Captured

CAPACITY = 1 << 16


@dataclass(frozen=True, slots=True)
class StepEnded:
    """An optimizer step finished (at its post-hook)."""

    step: int
    wall: float  # time.time() then
    mark: Any  # the step clock's mark, resolved into a duration on the agent thread
    samples: int | None  # None: not counted
    batch_size: int | None
    eval_s: float  # evaluation time inside the step, kept out of its duration
    marks: StepMarks | None  # the step anatomy's phase marks (None: anatomy off)


@dataclass(frozen=True, slots=True)
class Logged:
    """``mon.log(...)``: scalars as captured, read once their device copies land."""

    step: int
    values: dict[str, Captured]


@dataclass(frozen=True, slots=True)
class Flush:
    """Set ``done`` once everything before this record is processed and sent."""

    done: threading.Event


def make_inbox() -> deque[Any]:
    return deque(maxlen=CAPACITY)
