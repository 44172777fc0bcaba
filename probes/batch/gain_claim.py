"""The gain the autopilot claims: this run's progress per second against a fixed batch of the
size it started at, from what was measured.

Each metrics window adds its seconds at its size, weighted by the efficiency at the noise
scale of that moment, ``(φ + B0)/(φ + B)`` (``goodput``); the claim multiplies each size's
weighted seconds by its measured throughput over the start size's, and divides by all the
seconds. Only measured sizes count: the start size must have run, so the claim is never
against a batch that was not measured.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..wire.protocol import Metrics
from .goodput import MIN_WINDOWS, efficiency_ratio
from .verdict import SizeThroughput

HOW = "measured throughput at each size × the noise scale's efficiency, over the run's timed steps"


class GainLedger:
    def __init__(self, start_size: int) -> None:
        self.start_size = start_size
        self._phi: float | None = None  # the latest resolved noise scale
        self._seconds: dict[int, list[float]] = {}  # size -> [seconds, efficiency·seconds]

    def add(self, metrics: Metrics, phi: float | None) -> None:
        """One metrics window; ``phi``: the noise scale now (None: not resolved)."""
        if phi is not None:
            self._phi = phi
        size, step_time, steps = metrics.batch_size, metrics.step_time_s, metrics.steps_in_window
        if not size or not step_time or not steps:
            return
        if size == self.start_size:
            efficiency = 1.0
        elif self._phi is None:
            return  # no noise scale yet: a window at another size cannot be weighed
        else:
            efficiency = efficiency_ratio(size, self.start_size, self._phi)
        seconds = step_time * steps
        entry = self._seconds.setdefault(size, [0.0, 0.0])
        entry[0] += seconds
        entry[1] += seconds * efficiency

    def claim(self, sizes: Mapping[int, SizeThroughput]) -> tuple[float | None, str]:
        """The gain against a fixed start size, and how it was made (or why there is none);
        ``sizes``: the measured throughput at each size."""
        start = sizes.get(self.start_size)
        if start is None or start.windows < MIN_WINDOWS or not start.mean:
            return None, f"the start batch {self.start_size} was not measured long enough"
        total = progress = 0.0
        for size, (seconds, weighted) in self._seconds.items():
            measured = sizes.get(size)
            if measured is None or not measured.mean:
                return None, f"batch {size} has no measured throughput yet"
            total += seconds
            progress += weighted * measured.mean / start.mean
        if not total:
            return None, "nothing measured yet"
        return progress / total, f"against a fixed batch of {self.start_size}: {HOW}"
