"""Issue 40's goals and what a run's figures read against them (pure: no torch)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from .tracking import FIRST_DECISION, Point

MEDIAN_GOAL = 0.85  # live/exact, median over the checkpoints from the first decision
WITHIN = (0.67, 1.5)
WITHIN_GOAL = 0.80  # share of those checkpoints with live/exact inside WITHIN
COVERAGE_GOAL = 0.80  # share of those checkpoints whose 95% interval covers the exact value
CLOSED_GOAL = 0.05  # every stationary run within 5% of the truth
DRIFT_GOAL = 0.15  # the drift check at step 6,000
COST_GOAL = 1.02  # noise on / noise off, step time


@dataclass(frozen=True)
class Tracking:
    """The checkpoints that count (from the first the autopilot could decide at, per seed),
    and what they read. A counted checkpoint with no live value is outside [0.67, 1.5] and
    not covered; the median is over those with one. A run with no live value from step
    ``FIRST_DECISION`` to its end counts all those checkpoints as missing."""

    counted: int
    missing: int
    median: float | None
    within: float
    coverage: float

    @property
    def passed(self) -> bool:
        return (
            self.median is not None
            and self.median >= MEDIAN_GOAL
            and self.within >= WITHIN_GOAL
            and self.coverage >= COVERAGE_GOAL
        )


def counted(points: Sequence[Point]) -> list[Point]:
    """From the first checkpoint at or after step ``FIRST_DECISION`` with a live value on; a
    run that never has one counts every checkpoint from ``FIRST_DECISION`` on (all missing)."""
    start = next(
        (p.step for p in points if p.step >= FIRST_DECISION and p.live is not None),
        FIRST_DECISION,
    )
    return [p for p in points if p.step >= start]


def tracking(runs: Sequence[Sequence[Point]]) -> Tracking:
    """Every run's counted checkpoints, pooled."""
    points = [p for run in runs for p in counted(run)]
    ratios = [r for p in points if (r := p.ratio) is not None]
    low, high = WITHIN
    n = len(points)
    return Tracking(
        counted=n,
        missing=n - len(ratios),
        median=statistics.median(ratios) if ratios else None,
        within=sum(low <= r <= high for r in ratios) / n if n else 0.0,
        coverage=sum(p.covered for p in points) / n if n else 0.0,
    )


def verdict(passed: bool) -> str:
    return "PASS" if passed else "FAIL"


def cost_verdict(ratios: Sequence[float]) -> str:
    """PASS or FAIL when the median paired ratio is clear of ``COST_GOAL`` by two of its
    standard errors (from the interquartile range: 1.2533·σ/√n, σ ≈ IQR/1.349), else
    "NOT TOLD APART" with that error: on a shared machine the rounds can spread by far more
    than the 2% asked."""
    if len(ratios) < 4:
        return "NOT TOLD APART (too few rounds)"
    q1, median, q3 = statistics.quantiles(ratios, n=4)
    error = 1.2533 * (q3 - q1) / 1.349 / len(ratios) ** 0.5
    if median + 2 * error <= COST_GOAL:
        return "PASS"
    if median - 2 * error > COST_GOAL:
        return "FAIL"
    return f"NOT TOLD APART (±{2 * error:.3f})"
