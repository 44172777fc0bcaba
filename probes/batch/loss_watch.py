"""The loss after a batch-size change: did it hold, or diverge?

The loss the job logs (``mon.log(loss=...)``) arrives as one mean per metrics window. Before a
change, the last ``BASELINE_WINDOWS`` window means give its level (their median) and noise
(1.4826 × their median absolute deviation, which also absorbs the loss's own downward trend).
After the change, the loss has *diverged* when it is not finite, or when the median of the
last ``RECENT`` windows stands above the level by more than ``K`` times the noise, by more
than ``RELATIVE`` of the level, and by more than ``GIVE_BACK`` of the progress the run had
made (its first window's mean less the level): a sustained rise that undoes training, not one
noisy window, nor the wobble of a loss near zero (MNIST's 0.02 becoming 0.05 after a smaller
batch, when it started at 2.3). Once ``WATCH_STEPS`` steps have run at the new size without
that, the loss *held* and the size trained well.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

BASELINE_WINDOWS = 20
MIN_BASELINE = 3  # windows before the change needed to judge
RECENT = 3
K = 5.0
RELATIVE = 0.1
GIVE_BACK = 0.25  # of the drop from the run's first loss to the level before the change
WATCH_STEPS = 200
MIN_AFTER = 5  # windows after the change before "held"

HELD, DIVERGED, UNWATCHED = "held", "diverged", "not logged"


@dataclass(frozen=True)
class Baseline:
    level: float
    noise: float
    progress: float = 0.0  # how far the loss had come down from the run's first window

    @property
    def threshold(self) -> float:
        rise = max(K * self.noise, RELATIVE * abs(self.level), GIVE_BACK * self.progress)
        return self.level + rise


def baseline(values: list[float], first: float | None = None) -> Baseline | None:
    """The loss's level and noise from window means, and its progress since ``first`` (the
    run's first window mean); None: too few to judge."""
    if len(values) < MIN_BASELINE:
        return None
    level = statistics.median(values)
    mad = statistics.median(abs(v - level) for v in values)
    progress = max(0.0, first - level) if first is not None else 0.0
    return Baseline(level, 1.4826 * mad, progress)


@dataclass(frozen=True)
class Outcome:
    status: str  # HELD, DIVERGED or UNWATCHED
    before: float | None = None
    after: float | None = None


@dataclass
class _Watch:
    change_step: int
    base: Baseline | None
    steps: int = 0
    after: list[float] = field(default_factory=list)


class LossWatch:
    """Feed it every metrics window (``observe``); ``start`` at each change."""

    def __init__(self) -> None:
        self._recent: deque[float] = deque(maxlen=BASELINE_WINDOWS)
        self._first: float | None = None  # the run's first window mean
        self._watch: _Watch | None = None

    @property
    def watching(self) -> bool:
        return self._watch is not None

    def start(self, change_step: int) -> None:
        """A change was applied after ``change_step``: judge the loss from now on against the
        windows before it (a change still watched is dropped: it did not finish)."""
        self._watch = _Watch(change_step, baseline(list(self._recent), self._first))
        self._recent.clear()

    def observe(self, steps: int, loss: float | None, nonfinite: bool = False) -> Outcome | None:
        """One window of ``steps`` steps with its mean ``loss`` (None: not logged in it);
        ``nonfinite``: the job logged a NaN/inf loss in it. Returns the outcome once known."""
        watch = self._watch
        if loss is not None and math.isfinite(loss):
            self._recent.append(loss)
            if self._first is None:
                self._first = loss
        if watch is None:
            return None
        watch.steps += steps
        if nonfinite or (loss is not None and not math.isfinite(loss)):
            return self._end(Outcome(DIVERGED, watch.base.level if watch.base else None, loss))
        if loss is not None:
            watch.after.append(loss)
        base = watch.base
        if base is not None and len(watch.after) >= RECENT:
            level = statistics.median(watch.after[-RECENT:])
            if level > base.threshold:
                return self._end(Outcome(DIVERGED, base.level, level))
        if watch.steps >= WATCH_STEPS and (len(watch.after) >= MIN_AFTER or not watch.after):
            if base is None or not watch.after:
                return self._end(Outcome(UNWATCHED))
            return self._end(Outcome(HELD, base.level, statistics.median(watch.after[-RECENT:])))
        return None

    def _end(self, outcome: Outcome) -> Outcome:
        self._watch = None
        return outcome
