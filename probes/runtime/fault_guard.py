"""Exceptions raised inside bsmon code on the training thread stop here.

Each one is counted; the first of each kind (where + exception type) becomes an ``error``
event with a short traceback, later ones only raise the count, so a fault on every step
costs one append, not a flood of messages.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable

from ..wire.protocol import Event

Emit = Callable[[Event], None]


class FaultGuard:
    def __init__(self, emit: Emit, step: Callable[[], int]) -> None:
        self._emit = emit
        self._step = step
        self.count = 0
        self._seen: set[tuple[str, type]] = set()

    def report(self, where: str, exc: BaseException) -> None:
        try:
            self.count += 1
            key = (where, type(exc))
            if key in self._seen:
                return
            self._seen.add(key)
            tail = "".join(traceback.format_exception(exc, limit=-3)).strip()
            self._emit(
                Event(
                    t=time.time(),
                    step=self._step(),
                    kind="agent_error",
                    level="error",
                    message=f"bsmon caught {type(exc).__name__} in {where}: {exc} "
                    "(the job goes on; further ones are only counted)",
                    data={"where": where, "traceback": tail},
                )
            )
        except Exception:
            pass  # reporting must never raise either
