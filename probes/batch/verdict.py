"""What a batch-size change bought in throughput, said only once the step-time noise resolves it.

Throughput at a size is the summary's definition: the samples of its timed steps over their
summed durations, over every timed step the run spent at that size (a ratio of sums, not a
mean of rates). Its standard error comes from how the measurement windows (the metrics
messages live, the record's spans in the summary) scatter around that ratio: the ratio
estimator's

    SE(R)² = Σ (nᵢ − R·tᵢ)² / (k (k − 1) t̄²),   R = Σnᵢ / Σtᵢ,

for k windows of nᵢ samples in tᵢ seconds. A change's verdict waits until the two sizes
differ by more than ``Z`` standard errors of the difference; after ``MAX_WAIT_S`` seconds at
the new size without that (those a probe shared not counted: ``watch``), the verdict is "no
measurable difference".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..wire.protocol import ThroughputVerdict

Z = 3.5  # standard errors of the difference that make it a verdict (see the docs)
MIN_WINDOWS = 10  # windows at each size before an SE means anything
MAX_WAIT_S = 60.0  # timed seconds at the new size before "no measurable difference"

FASTER: ThroughputVerdict = "faster"
SLOWER: ThroughputVerdict = "slower"
SAME: ThroughputVerdict = "no measurable difference"
LEFT: ThroughputVerdict = "left before a verdict"
UNCOMPARED: ThroughputVerdict = "too little measured before it"  # the old size ran too briefly


@dataclass
class SizeThroughput:
    """Running sums over one size's windows: enough for the ratio and its standard error."""

    windows: int = 0
    samples: float = 0.0
    seconds: float = 0.0
    samples_sq: float = 0.0
    seconds_sq: float = 0.0
    cross: float = 0.0

    def add(self, samples: float, seconds: float) -> None:
        if not (seconds > 0 and samples >= 0 and math.isfinite(samples + seconds)):
            return
        self.windows += 1
        self.samples += samples
        self.seconds += seconds
        self.samples_sq += samples * samples
        self.seconds_sq += seconds * seconds
        self.cross += samples * seconds

    @property
    def mean(self) -> float | None:
        """Samples per second over every window (None before the first)."""
        return self.samples / self.seconds if self.seconds > 0 else None

    @property
    def se(self) -> float | None:
        """The standard error of ``mean`` (None with fewer than two windows)."""
        k = self.windows
        if k < 2 or self.seconds <= 0:
            return None
        r = self.samples / self.seconds
        scatter = self.samples_sq - 2 * r * self.cross + r * r * self.seconds_sq
        mean_t = self.seconds / k
        return math.sqrt(max(scatter, 0.0) / (k * (k - 1))) / mean_t


@dataclass(frozen=True)
class Verdict:
    outcome: ThroughputVerdict  # FASTER, SLOWER, SAME or UNCOMPARED
    before: float
    after: float
    se_before: float
    se_after: float

    @property
    def gain(self) -> float:
        return self.after / self.before - 1

    def text(self, old: int, new: int) -> str:
        if self.outcome == UNCOMPARED:
            return (
                f"batch {old} → {new}: no verdict, too little was measured at {old} to compare; "
                f"{new} runs at {self.after:,.0f} ± {self.se_after:,.0f} samples/s"
            )
        figures = (
            f"{self.before:,.0f} ± {self.se_before:,.0f} → "
            f"{self.after:,.0f} ± {self.se_after:,.0f} samples/s"
        )
        if self.outcome == SAME:
            bound = Z * math.hypot(self.se_before, self.se_after) / self.before
            return (
                f"batch {old} → {new}: no measurable difference in throughput "
                f"(within ±{bound:.0%}; {figures})"
            )
        return f"batch {old} → {new} bought {self.gain:+.0%} throughput ({figures})"


def judge(before: SizeThroughput, after: SizeThroughput, waited_s: float) -> Verdict | None:
    """The verdict once the difference is resolved (or the wait is over), else None."""
    if after.windows < MIN_WINDOWS:
        return None
    if before.windows < MIN_WINDOWS:
        if waited_s < MAX_WAIT_S or after.mean is None or after.se is None:
            return None
        return Verdict(UNCOMPARED, before.mean or 0.0, after.mean, before.se or 0.0, after.se)
    b, a, sb, sa = before.mean, after.mean, before.se, after.se
    if b is None or a is None or sb is None or sa is None or b <= 0:
        return None
    diff, se = a - b, math.hypot(sb, sa)
    if abs(diff) > Z * se:
        return Verdict(FASTER if diff > 0 else SLOWER, b, a, sb, sa)
    if waited_s >= MAX_WAIT_S:
        return Verdict(SAME, b, a, sb, sa)
    return None
