"""The agent thread's aggregates: the last steps' phases, and each history interval's."""

from __future__ import annotations

from collections import deque

from ..wire.protocol import StepAnatomy
from .seconds import Phases, PhaseTotals

RECENT_STEPS = 100  # the live anatomy averages this many steps


def anatomy_of(totals: PhaseTotals, clock: str = "") -> StepAnatomy | None:
    """Seconds per step from summed phases (None: no step split yet)."""
    n = totals.steps
    if n <= 0:
        return None

    def per_step(seconds: float | None) -> float | None:
        return None if seconds is None else max(0.0, seconds) / n

    return StepAnatomy(
        steps=n,
        step_s=per_step(totals.step_s),
        data_s=per_step(totals.data_s),
        forward_s=per_step(totals.forward_s),
        backward_s=per_step(totals.backward_s),
        optimizer_s=per_step(totals.optimizer_s),
        other_s=per_step(totals.other_s),
        comm_s=per_step(totals.comm_s),
        comm_total_s=per_step(totals.comm_total_s),
        clock=clock,
    )


def totals_of(anatomy: StepAnatomy) -> PhaseTotals:
    """The summed phases a per-step reading stands for (``anatomy_of`` undone)."""
    n = anatomy.steps

    def total(seconds: float | None) -> float | None:
        return None if seconds is None else seconds * n

    return PhaseTotals(
        steps=n,
        step_s=(anatomy.step_s or 0.0) * n,
        data_s=total(anatomy.data_s),
        forward_s=(anatomy.forward_s or 0.0) * n,
        backward_s=(anatomy.backward_s or 0.0) * n,
        optimizer_s=total(anatomy.optimizer_s),
        other_s=(anatomy.other_s or 0.0) * n,
        comm_s=total(anatomy.comm_s),
        comm_total_s=total(anatomy.comm_total_s),
    )


class PhaseWindow:
    """Rolling totals of the last ``RECENT_STEPS`` split steps, and the totals since the last
    history point."""

    def __init__(self, clock: str = "wall clock") -> None:
        self.clock = clock
        self._recent: deque[tuple[float, Phases]] = deque()
        self._rolling = PhaseTotals()
        self._interval = PhaseTotals()

    def add(self, training_s: float, phases: Phases) -> None:
        self._rolling.add(training_s, phases)
        self._interval.add(training_s, phases)
        self._recent.append((training_s, phases))
        if len(self._recent) > RECENT_STEPS:
            old_s, old = self._recent.popleft()
            self._rolling.add(old_s, old, steps=-1)

    def recent(self) -> StepAnatomy | None:
        return anatomy_of(self._rolling, self.clock)

    def take_interval(self) -> PhaseTotals | None:
        """The totals since the last call (None: no split step in between)."""
        interval, self._interval = self._interval, PhaseTotals()
        return interval if interval.steps else None
