"""What every part of the job is handed when it is made: the step clock, the way out for its
events, the fault guard and the session. A part takes the context instead of an ``emit=``,
``step=`` and ``guard=`` each, and says a warning with ``warn`` instead of building the event
by hand."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from ..wire.protocol import Event, SessionInfo
from .fault_guard import FaultGuard
from .progress import Progress


@dataclasses.dataclass(frozen=True, eq=False)
class JobContext:
    progress: Progress  # the training thread's step count: progress() or progress.step
    emit: Callable[[Event], None]  # an event for the job's events (O(1), any thread)
    guard: FaultGuard  # where a failure of bsmon's own code goes
    session: SessionInfo
    _warned: set[str] = dataclasses.field(default_factory=set, repr=False)

    def warn(
        self,
        kind: str,
        message: str,
        *,
        step: int | None = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        """A warning event now, at ``step`` (default: the step in progress)."""
        at = self.progress.step if step is None else step
        self.emit(Event(time.time(), at, kind, message, level="warning", data=data or {}))

    def warn_once(self, kind: str, message: str) -> None:
        """A warning from the literature, once per kind."""
        if kind not in self._warned:
            self._warned.add(kind)
            self.warn(kind, message)
