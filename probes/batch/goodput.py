"""The model the autopilot steers by: progress per second at a batch size B.

- **Step time** ``t(B) = t0 + c·B``, fitted from the job's own measured throughput at each
  size it ran (``fit_step_time``). ``B½ = t0/c`` is the batch at which throughput is half its
  limit. With one size measured the fit is AdaptDL's optimistic prior, ``t0 = t(B)/2`` (so
  B½ equals that size: a bigger batch looks worth trying, and trying it measures a second
  size); a declared B½ replaces the fit's shape and keeps only its scale.
- **Efficiency** ``E(B) = (φ + B0)/(φ + B)``: the progress one example makes at B relative to
  B0, from the gradient noise scale φ = B_simple (McCandlish et al. 2018; Pollux's
  efficiency). Steps to a target scale as ``1 + φ/B``.
- **Goodput** = throughput × efficiency. With ``t(B) = c(B½ + B)`` its maximum is at
  ``B* = √(B½·φ)`` (research/autopilot.md F8).
- **The re-gather** (``Regather``): a sharded job (FSDP2) growing by gradient accumulation
  gathers its parameters again in every micro-batch; where the line was not measured at two
  sizes it cannot know that, so each micro-batch more than the current size's adds its
  all-gather time to ``t(B)``. A smaller size is left to the line: an estimate above the
  share of the measured step it stands for would predict a step of no time at all.

Only ratios matter to a decision, so every function here returns one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ..units import count, duration
from ..wire.protocol import NONE_WILL_COME, NoiseScaleReading
from .verdict import SizeThroughput

MIN_WINDOWS = 1  # metrics windows at a size (besides SETTLE_STEPS steps) before it is a point
FITTED = "fitted from"  # a line through sizes the job ran: it holds what they cost


@dataclass(frozen=True)
class Regather:
    """The price of growing by accumulation under sharding: ``seconds`` of all-gather in each
    micro-batch of ``micro_batch`` examples, counted from ``base`` micro-batches per step (the
    current size's); ``how``: measured, or estimated and on what assumption."""

    micro_batch: int
    base: int
    seconds: float
    how: str

    def extra_s(self, size: float) -> float:
        return max(0, math.ceil(size / self.micro_batch) - self.base) * self.seconds

    def price(self, size: int) -> str:
        more = math.ceil(size / self.micro_batch) - self.base
        return (
            f"{more} more micro-batch{'es' if more != 1 else ''} of {self.micro_batch:,} per "
            f"step, each gathering the sharded parameters again: +{duration(more * self.seconds)}"
            f" a step ({duration(self.seconds)} each, {self.how})"
        )


@dataclass(frozen=True)
class StepTimeModel:
    """``t(B) = intercept_s + per_sample_s·B``, plus the re-gather where it applies; ``how``
    says where its shape came from."""

    intercept_s: float
    per_sample_s: float
    how: str
    regather: Regather | None = None

    @property
    def half_batch(self) -> float:
        """B½ = t0/c: infinite when a bigger batch costs no more time per step."""
        if self.per_sample_s <= 0:
            return math.inf
        return self.intercept_s / self.per_sample_s

    def step_time(self, size: float) -> float:
        line = self.intercept_s + self.per_sample_s * size
        return line + self.regather.extra_s(size) if self.regather is not None else line

    def speed_ratio(self, new: float, old: float) -> float:
        """Samples per second at ``new`` over those at ``old``."""
        if self.regather is None:
            return throughput_ratio(new, old, self.half_batch)
        return (new / self.step_time(new)) / (old / self.step_time(old))

    def price(self, new: int, old: int) -> str | None:
        """What growing from ``old`` to ``new`` costs beyond the line (None: nothing)."""
        if self.regather is None or new <= old or not self.regather.extra_s(new):
            return None
        return "the price of growing by accumulation: " + self.regather.price(new)

    def with_regather(self, regather: Regather | None) -> StepTimeModel:
        """The re-gather added where the line has not measured it (one size measured, or its
        shape declared or from the probe); a line fitted from two sizes the job ran holds it."""
        if regather is None:
            return self
        if self.how.startswith(FITTED):
            return replace(self, how=f"{self.how}, each with its re-gathers")
        return replace(self, regather=regather)


def measured_points(sizes: Mapping[int, SizeThroughput]) -> dict[int, tuple[float, float]]:
    """Each size with enough windows: (step time in seconds, seconds measured there)."""
    points = {}
    for size, throughput in sizes.items():
        rate = throughput.mean
        if throughput.windows >= MIN_WINDOWS and rate:
            points[size] = (size / rate, throughput.seconds)
    return points


def fit_step_time(
    sizes: Mapping[int, SizeThroughput],
    declared_half: float | None = None,
    probe_half: float | None = None,
) -> StepTimeModel | None:
    """The step-time line through the measured sizes, weighted by the time spent at each
    (None: no size measured yet). ``probe_half``: B½ from the probe's step times, the shape
    while the job itself has run only one size."""
    points = measured_points(sizes)
    if not points:
        return None
    how = f"declared B½ = {declared_half:g}" if declared_half is not None else ""
    if declared_half is None and probe_half is not None and len(points) == 1:
        declared_half, how = probe_half, "from the probe's step times"
    if declared_half is not None:
        # t(B) = c·(B½ + B): only c is fitted, by weighted least squares
        top = sum(w * t * (declared_half + b) for b, (t, w) in points.items())
        bottom = sum(w * (declared_half + b) ** 2 for b, (_t, w) in points.items())
        c = top / bottom
        return StepTimeModel(c * declared_half, c, how)
    if len(points) == 1:
        ((size, (step_time, _w)),) = points.items()
        return StepTimeModel(
            step_time / 2,
            step_time / (2 * size),
            f"assumed: one size measured ({size}), B½ taken as that size until a second runs",
        )
    intercept, slope = weighted_line(points)
    slope = max(slope, 0.0)
    return StepTimeModel(max(intercept, 0.0), slope, f"{FITTED} {len(points)} sizes")


def weighted_line(points: Mapping[int, tuple[float, float]]) -> tuple[float, float]:
    """(intercept, slope) of step time on batch size, each size's point (time, weight)
    weighted; two sizes at least."""
    total = sum(w for _t, w in points.values())
    mean_b = sum(w * b for b, (_t, w) in points.items()) / total
    mean_t = sum(w * t for t, w in points.values()) / total
    spread = sum(w * (b - mean_b) ** 2 for b, (_t, w) in points.items())
    slope = sum(w * (b - mean_b) * (t - mean_t) for b, (t, w) in points.items()) / spread
    return mean_t - slope * mean_b, slope


def throughput_ratio(new: float, old: float, half: float) -> float:
    """Samples per second at ``new`` over those at ``old`` under ``t(B) = c(B½ + B)``."""
    if math.isinf(half):
        return new / old
    return (new / old) * (half + old) / (half + new)


def efficiency_ratio(new: float, old: float, phi: float) -> float:
    """Progress per example at ``new`` over that at ``old``: (φ + old)/(φ + new) (1 where
    φ is unbounded: the loss measured no cost per example)."""
    if math.isinf(phi):
        return 1.0
    return (phi + old) / (phi + new)


def goodput_gain(new: float, old: float, *, phi: float, half: float) -> float:
    """Predicted progress per second at ``new`` over that at ``old``."""
    return throughput_ratio(new, old, half) * efficiency_ratio(new, old, phi)


def break_even(
    new: float, old: float, half: float, threshold: float, speed: float | None = None
) -> float | None:
    """The noise scale φ at which moving from ``old`` to ``new`` predicts exactly
    ``threshold``× the progress per second: growing pays above it, shrinking below it (None:
    no φ makes it pay, or every one does). ``speed``: the throughput ratio, when the model
    gives it (the re-gather), else from B½."""
    speed = throughput_ratio(new, old, half) if speed is None else speed
    if speed == threshold:
        return None
    phi = (threshold * new - speed * old) / (speed - threshold)
    return phi if phi > 0 else None


def probe_half_batch(points: Sequence[tuple[int, float]]) -> float | None:
    """B½ of the step-time line through the probe's (batch size, step time) readings, each
    alike (the sidecar's times are not the job's, but their shape is: its first size is the
    job's own); None without two sizes or with a line that does not rise."""
    by_size = {size: (step_time, 1.0) for size, step_time in points}
    if len(by_size) < 2:
        return None
    intercept, slope = weighted_line(by_size)
    return max(intercept, 0.0) / slope if slope > 0 else None


def optimum(phi: float, half: float) -> float:
    """B* = √(B½·φ), the batch that maximises goodput (infinite when B½ is)."""
    return math.sqrt(half * phi) if math.isfinite(half) else math.inf


@dataclass(frozen=True)
class Estimate:
    """The noise scale as the autopilot reads it: the point and its 95% interval, in one
    rank's examples (the batch it steers is a rank's: each of ``ranks`` ranks takes as many,
    and B_simple counts the whole step's), so that size / (size + point) is a step's worth."""

    point: float
    low: float
    high: float
    ranks: int = 1

    @property
    def for_growth(self) -> float:
        """What growth steers by: √(point · low), about a one-sided 84% lower bound (z ≈ 1 on
        the log scale on which the interval's low end is z = 1.96). The low end itself
        discounted twice on a young run, whose live estimate already lags a rising B_simple
        (docs/autopilot.md)."""
        return math.sqrt(self.point * self.low)


def resolved(noise: NoiseScaleReading) -> Estimate | None:
    """The estimate when it can steer: a point and a bounded 95% interval above zero."""
    if noise.b_simple is None or noise.ci_low is None or noise.ci_high is None:
        return None
    if not (noise.ci_low > 0 and math.isfinite(noise.ci_high)):
        return None
    ranks = max(noise.ranks, 1)
    return Estimate(noise.b_simple / ranks, noise.ci_low / ranks, noise.ci_high / ranks, ranks)


def unresolved_reason(noise: NoiseScaleReading | None) -> str:
    """Why the estimate cannot steer yet, with what it does say: at a batch far below
    B_simple each measured step reads |G|² with a spread several times its mean, and the
    estimate may show only its lower bound for thousands of steps (docs/autopilot.md)."""
    wait = "waiting for B_simple to resolve"
    if noise is not None and noise.status and noise.status.startswith(NONE_WILL_COME):
        return f"B_simple: {noise.status}"
    if noise is None or not noise.needed:  # nothing measured yet
        return f"{wait} (a bounded interval)"
    if noise.effective < noise.needed:
        return f"{wait} ({noise.effective:.0f} of {noise.needed} effective steps)"
    if noise.b_simple is None and noise.lower_bound is not None:
        return f"{wait}: ≥ {count(noise.lower_bound)}, |G|² within its noise"
    if noise.b_simple is None:
        return f"{wait}: |G|² not above zero beyond its error"
    return f"{wait}: ≈ {count(noise.b_simple)}, its interval unbounded"
