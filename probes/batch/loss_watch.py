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

A divergence is a state, not the end of the watch: the loss goes on being watched at that
size, and it has *recovered* when the median of the last ``RECENT`` windows after the
divergence is back at or under the same threshold (the divergence rule turned round: a
sustained return, not one low window). A NaN/inf recovers only the same way, once finite
window means come back under the threshold (a window with no finite value is no evidence).
A new change ends the watch; a loss that never comes back stays diverged.
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

HELD, DIVERGED, RECOVERED, UNWATCHED = "held", "diverged", "recovered", "not logged"


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
    status: str  # HELD, DIVERGED, RECOVERED or UNWATCHED
    before: float | None = None
    after: float | None = None


@dataclass
class _Watch:
    change_step: int
    base: Baseline | None
    steps: int = 0
    after: list[float] = field(default_factory=list)
    diverged: bool = False  # declared: ``after`` now holds the windows since, for a recovery


class LossWatch:
    """Feed it every metrics window (``observe``); ``start`` at each change."""

    def __init__(self) -> None:
        self._recent: deque[float] = deque(maxlen=BASELINE_WINDOWS)
        self._first: float | None = None  # the run's first window mean
        self._watch: _Watch | None = None

    @property
    def watching(self) -> bool:
        """A change's loss is being judged: held or diverged (not yet declared)."""
        return self._watch is not None and not self._watch.diverged

    def start(self, change_step: int) -> None:
        """A change was applied after ``change_step``: judge the loss from now on against the
        windows before it (a change still watched is dropped: it did not finish)."""
        self._watch = _Watch(change_step, baseline(list(self._recent), self._first))
        self._recent.clear()

    def observe(self, steps: int, loss: float | None, nonfinite: bool = False) -> Outcome | None:
        """One window of ``steps`` steps with its mean ``loss`` (None: not logged in it);
        ``nonfinite``: the job logged a NaN/inf loss in it. Returns each outcome once known:
        held, unwatched, or diverged and later, perhaps, recovered."""
        watch = self._watch
        if loss is not None and math.isfinite(loss):
            self._recent.append(loss)
            if self._first is None:
                self._first = loss
        if watch is None:
            return None
        if watch.diverged:
            return self._recovery(watch, loss)
        watch.steps += steps
        if nonfinite or (loss is not None and not math.isfinite(loss)):
            level = watch.base.level if watch.base else None
            return self._diverged(watch, Outcome(DIVERGED, level, loss))
        if loss is not None:
            watch.after.append(loss)
        base = watch.base
        if base is not None and len(watch.after) >= RECENT:
            level = statistics.median(watch.after[-RECENT:])
            if level > base.threshold:
                return self._diverged(watch, Outcome(DIVERGED, base.level, level))
        if watch.steps >= WATCH_STEPS and (len(watch.after) >= MIN_AFTER or not watch.after):
            if base is None or not watch.after:
                return self._end(Outcome(UNWATCHED))
            return self._end(Outcome(HELD, base.level, statistics.median(watch.after[-RECENT:])))
        return None

    def _diverged(self, watch: _Watch, outcome: Outcome) -> Outcome:
        """Go on watching for a recovery, where there is a threshold to come back under."""
        if watch.base is None:
            return self._end(outcome)
        watch.diverged, watch.after = True, []
        return outcome

    def _recovery(self, watch: _Watch, loss: float | None) -> Outcome | None:
        """One window after a divergence. Only the window's finite mean is evidence: the
        caller's ``nonfinite`` says a NaN was logged at some point since the change."""
        if loss is None:
            return None
        if not math.isfinite(loss):
            watch.after.clear()  # a NaN/inf window is not back: the stretch starts again
            return None
        watch.after = [*watch.after[1 - RECENT :], loss]
        base = watch.base
        assert base is not None  # _diverged watches only with a threshold
        level = statistics.median(watch.after)
        if len(watch.after) < RECENT or level > base.threshold:
            return None
        return self._end(Outcome(RECOVERED, base.level, level))

    def _end(self, outcome: Outcome) -> Outcome:
        self._watch = None
        return outcome
