"""The search for a real out-of-memory boundary, one trial (a fresh process) at a time,
starting from what the probe already knows.

A search starts from the probe's own bounds — the largest size it ran (and confirmed), the
smallest it saw fail — and its prediction. Its first trial is at the prediction; the next
ones step away from it on a ladder of rungs, first ``2 × tolerance`` off, then ``goal`` off,
so that when the prediction is good the boundary is bracketed within a rung of it in two or
three trials; then it bisects until the bracket is within the tolerance. The probe's bounds
are claims (the sidecar ran beside the job, under its cap), not facts: a bracket that ends on
one is settled by a trial at it, and a trial that contradicts one wins.

Pure arithmetic: nothing here runs a trial or imports torch, so it is tested with a fake
``fits``. ``fits`` is taken to be monotone (a size fits when a larger one does).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Boundary:
    """What is known of the largest batch that fits, and where to try next.

    ``claimed_fit``: the largest size the probe ran (0: none); ``claimed_fail``: the smallest it
    saw fail (None: none). ``trials``: each trial as (size, fits), in order."""

    predicted: int
    goal: float  # the prediction's goal (± fraction of the boundary): the far rung
    tolerance: float  # the bracket's width, as a fraction of its lower end, to stop at
    claimed_fit: int = 0
    claimed_fail: int | None = None
    trials: list[tuple[int, bool]] = field(default_factory=list)

    # -- what is known --------------------------------------------------------------------

    @property
    def tried_fit(self) -> int:
        """The largest size a trial ran (0: none)."""
        return max((size for size, fits in self.trials if fits), default=0)

    @property
    def tried_fail(self) -> int | None:
        """The smallest size a trial saw fail (None: none)."""
        return min((size for size, fits in self.trials if not fits), default=None)

    @property
    def low(self) -> int:
        """The largest size known to fit: a trial's, or the probe's claim where no trial
        contradicts it."""
        fail = self.tried_fail
        claim = self.claimed_fit
        if claim > self.tried_fit and (fail is None or claim < fail):
            return claim
        return self.tried_fit

    @property
    def high(self) -> int | None:
        """The smallest size known to fail (None: none yet), likewise."""
        claim, fail = self.claimed_fail, self.tried_fail
        if claim is not None and claim > self.tried_fit and (fail is None or claim < fail):
            return claim
        return fail

    @property
    def consistent(self) -> bool:
        """False when a trial failed at or below a size another trial ran."""
        fail = self.tried_fail
        return fail is None or fail > self.tried_fit

    @property
    def narrow(self) -> bool:
        """The bracket is within the tolerance, rounded up to a whole batch (its ends may
        still be the probe's claims)."""
        high = self.high
        return high is not None and high - self.low <= max(1, math.ceil(self.low * self.tolerance))

    @property
    def converged(self) -> bool:
        """Narrow, with both ends settled by trials."""
        return (
            self.consistent
            and self.narrow
            and self.low == self.tried_fit
            and self.high == self.tried_fail
        )

    def fits(self, size: int) -> bool | None:
        """Whether ``size`` fits by the trials alone (None: they do not say)."""
        fail = self.tried_fail
        if size <= self.tried_fit:
            return True
        if fail is not None and size >= fail:
            return False
        return None

    def settle(self, fits: Callable[[int], bool], size: int) -> bool:
        """Whether ``size`` fits: by the trials when they say, else by a trial at it."""
        known = self.fits(size)
        if known is None:
            known = fits(size)
            self.trials.append((size, known))
        return known

    def error_range(self, predicted: int) -> tuple[float, float]:
        """``predicted / boundary − 1`` over every boundary the bracket allows, as (least,
        most); the least is −1 while no size is known to fail."""
        high = self.high
        least = predicted / (high - 1) - 1 if high is not None and high > 1 else -1.0
        most = predicted / self.low - 1 if self.low else math.inf
        return least, most

    # -- where to try next ----------------------------------------------------------------

    def rungs(self) -> list[int]:
        """Two sizes away from the prediction, on the side where the boundary lies (below
        it when it failed, above when it fitted): a near rung, twice the tolerance off (a
        bracket one halving from narrow), then the goal's edge (past it, the prediction is
        off by more than its goal)."""
        p = self.predicted
        near = 2 * self.tolerance
        if self.low >= p:  # the prediction fitted: the boundary is at or above it
            return [p + max(1, math.floor(p * near)), math.floor(p / (1 - self.goal)) + 1]
        return [math.ceil(p / (1 + near)), math.ceil(p / (1 + self.goal))]

    def next_size(self) -> int | None:
        """The size to try next, or None when the search is done (converged, or its trials
        contradict each other)."""
        low, high = self.low, self.high
        if not self.consistent:
            return None
        if self.narrow:  # settle an end that is still the probe's claim
            if low and low != self.tried_fit:
                return low
            if high != self.tried_fail:
                return high
            return None
        if low < self.predicted and (high is None or self.predicted < high):
            return self.predicted
        for size in self.rungs():
            if low < size and (high is None or size < high):
                return size
        if high is None:
            return max(2 * low, low + 1)
        return (low + high) // 2


def search_boundary(fits: Callable[[int], bool], boundary: Boundary, max_runs: int) -> Boundary:
    """Run trials (``fits(size)``) until ``boundary`` has converged or ``max_runs`` trials
    are spent; the trials are recorded as they run, so an exception from ``fits`` leaves
    what was learned before it."""
    while len(boundary.trials) < max_runs and (size := boundary.next_size()) is not None:
        boundary.trials.append((size, fits(size)))
    return boundary
