"""The gain the autopilot claims: this run's progress per second against a fixed batch of the
size it started at, from what was measured.

Each metrics window adds its timed seconds and its samples, weighted by the efficiency at the
noise scale of that moment, ``(φ + B0)/(φ + B)`` (``goodput``): what they are worth in
samples at the start size. The claim is the seconds a fixed start size would need for that
worth, at its measured throughput, over the seconds taken. The start size must have run, so
the claim is never against a batch that was not measured.

The start size's throughput is what bsmon costs it as usual: its windows once the noise
scale's warm-up is over. The warm-up measures three steps in four, so its windows at the
start size are left out of the claim. A fast ramp leaves the start size during the warm-up;
then the base is the start size's steps the noise scale did not measure (the budget's plain
steps, before the batch first changed). Against the warm-up's windows the claim read +30% on
``benchmarks/autopilot.py``'s T1, and a run that never changed size claimed 0.91×.
"""

from __future__ import annotations

from ..noise.controller import WARMING_UP
from ..wire.protocol import Metrics
from .goodput import efficiency_ratio

HOW = "measured throughput at each size × the noise scale's efficiency, over the run's timed steps"


class GainLedger:
    def __init__(self, start_size: int) -> None:
        self.start_size = start_size
        self._phi: float | None = None  # the latest resolved noise scale
        self._seconds = 0.0  # timed seconds in the windows counted
        self._worth = 0.0  # their samples, each weighted by its efficiency against the start
        self._start_samples = 0.0  # the start size's windows after the warm-up
        self._start_seconds = 0.0
        self._left_start = False
        self._start_plain_s: float | None = None  # the start size's unmeasured step time
        self._warming = 0  # the start size's windows left out: the noise scale's warm-up
        self._unweighed = 0  # windows at another size before the noise scale resolved

    def add(self, metrics: Metrics, phi: float | None, plain_step_s: float | None = None) -> None:
        """One metrics window; ``phi``: the noise scale now (None: not resolved);
        ``plain_step_s``: a recent step's time the noise scale did not measure, if known."""
        if phi is not None:
            self._phi = phi
        size, step_time, steps = metrics.batch_size, metrics.step_time_s, metrics.steps_in_window
        self._left_start = self._left_start or size != self.start_size
        rate = metrics.samples_per_s
        if not size or not step_time or not steps or not rate:
            return
        seconds = step_time * steps
        if size == self.start_size:
            if metrics.noise is not None and metrics.noise.phase == WARMING_UP:
                if not self._left_start and plain_step_s:
                    self._start_plain_s = plain_step_s
                self._warming += 1
                return
            efficiency = 1.0
            self._start_samples += rate * seconds
            self._start_seconds += seconds
        elif self._phi is None:
            self._unweighed += 1  # no noise scale yet: a window at another size cannot be weighed
            return
        else:
            efficiency = efficiency_ratio(size, self.start_size, self._phi)
        self._seconds += seconds
        self._worth += rate * seconds * efficiency

    def claim(self) -> tuple[float | None, str]:
        """The gain against a fixed start size, and how it was made (or why there is none)."""
        if self._start_seconds:
            base = self._start_samples / self._start_seconds
        elif self._start_plain_s:
            base = self.start_size / self._start_plain_s
        else:
            return None, f"the start batch {self.start_size} was not measured long enough"
        if not self._seconds:
            return None, self._nothing_counted()
        return self._worth / base / self._seconds, (
            f"against a fixed batch of {self.start_size}: {HOW}"
        )

    def _nothing_counted(self) -> str:
        """Why no window counts toward the claim yet, though the start size has a base."""
        why = []
        if self._warming:
            why.append(
                f"batch {self.start_size} ran only in the noise scale's warm-up, whose windows "
                "are left out (it measures three steps in four)"
            )
        if self._unweighed:
            why.append("the other sizes ran before B_simple resolved")
        return "; ".join(why) or "no timed window yet"
