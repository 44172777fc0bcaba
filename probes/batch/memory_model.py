"""The job's own memory model: peak allocated memory per batch size, fitted by a line.

Every batch size the job has run gives a measured point (the allocator's peak counter is reset
at each switch). With two sizes or more, peak ≈ a + s·B is fitted by least squares and the
largest batch that keeps the predicted peak under a fraction of the budget is a *prediction*,
never a promise: it is shown and used as such. With one size, a larger one is bounded by
scaling its peak, less what every step holds whatever the batch (``footprint``: the
parameters and optimizer state, under FSDP2 this rank's shards of them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..wire.protocol import MemoryPoint
from .footprint import Footprint

SAFE_FRACTION = 0.9


@dataclass(frozen=True)
class LineFit:
    intercept: float
    slope: float
    points: int

    def peak(self, batch_size: int) -> float:
        return self.intercept + self.slope * batch_size

    def largest_within(self, budget: float) -> int | None:
        if self.slope <= 0:
            return None
        return max(0, math.floor((budget - self.intercept) / self.slope))


class MemoryModel:
    def __init__(self) -> None:
        self._peaks: dict[int, int] = {}
        self._steps: dict[int, int] = {}
        self.footprint: Footprint | None = None  # what the job holds whatever its batch

    def observe(self, batch_size: int, peak_bytes: int, steps: int) -> None:
        """Record a peak reading taken after ``steps`` steps at ``batch_size``."""
        if steps < 1 or peak_bytes <= 0:
            return
        self._peaks[batch_size] = max(self._peaks.get(batch_size, 0), peak_bytes)
        self._steps[batch_size] = max(self._steps.get(batch_size, 0), steps)

    def points(self) -> list[MemoryPoint]:
        return [
            MemoryPoint(batch_size=b, peak_bytes=p, steps=self._steps[b])
            for b, p in sorted(self._peaks.items())
        ]

    def fit(self) -> LineFit | None:
        sizes = sorted(self._peaks)
        if len(sizes) < 2:
            return None
        xs = [float(b) for b in sizes]
        ys = [float(self._peaks[b]) for b in sizes]
        n = len(xs)
        mean_x, mean_y = sum(xs) / n, sum(ys) / n
        sxx = sum((x - mean_x) ** 2 for x in xs)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx
        return LineFit(intercept=mean_y - slope * mean_x, slope=slope, points=n)

    def predicted_peak(self, batch_size: int) -> float | None:
        fit = self.fit()
        return fit.peak(batch_size) if fit is not None else None

    def predicted_max(self, budget_bytes: int | None) -> int | None:
        fit = self.fit()
        if fit is None or not budget_bytes:
            return None
        return fit.largest_within(SAFE_FRACTION * budget_bytes)

    def proportional_bound(self, batch_size: int) -> float | None:
        """An upper bound on the peak at ``batch_size`` from measured smaller sizes: f + (peak(b)
        - f)·B/b, where f is what every step holds (``Footprint.held``; 0 unknown), valid
        while the rest of the part that does not grow with the batch is ≥ 0; None: none
        smaller. f must be this rank's: a sharded model's whole size would overstate it, and
        the bound would then understate the peak."""
        held = self.footprint.held if self.footprint is not None else 0
        bounds = [
            min(held, p) + (p - min(held, p)) * batch_size / b
            for b, p in self._peaks.items()
            if b < batch_size
        ]
        return min(bounds) if bounds else None

    def needs_confirmation(self, batch_size: int, budget_bytes: int | None) -> str | None:
        """Why a switch to ``batch_size`` should be confirmed, or None."""
        peak = self.predicted_peak(batch_size)
        if peak is None or not budget_bytes or peak <= SAFE_FRACTION * budget_bytes:
            return None
        share = peak / budget_bytes
        return (
            f"the memory model predicts a peak of {peak / 2**30:.1f} GiB at batch "
            f"{batch_size}, {share:.0%} of the {budget_bytes / 2**30:.1f} GiB available "
            f"(fit of {len(self._peaks)} measured sizes)"
        )
