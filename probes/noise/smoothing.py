"""Smoothing: the ratio of two exponential moving averages, with its uncertainty.

Per-step estimates of |G|² are often negative (≈20% of steps even at B_simple ≈ 2B), so the
per-step ratio has no usable mean (research note §1.5). bsmon keeps exponentially weighted
means of |G|² and of tr Σ separately — bias-corrected, i.e. normalised by the sum of the
weights — and reports their ratio. The weighted (co)variances of the per-step values, kept
with a decayed weighted Welford update (numerically stable), give the standard error of the
ratio by the delta method and a 95% interval by Fieller's theorem; the effective number of
steps is (Σw)²/Σw².

Until the window holds enough steps, or while the mean |G|² is not significantly above zero,
there is no point estimate: ``b_simple`` is None and, when it can be said, ``lower_bound`` is
tr Σ / (|G|² + z·se), i.e. "B_simple is at least this".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Z95 = 1.959963984540054
MIN_EFFECTIVE_STEPS = 30
MEASURED_MEMORY = 100  # the averages always remember about this many measured steps


@dataclass(frozen=True, slots=True)
class Estimate:
    b_simple: float | None = None
    stderr: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    lower_bound: float | None = None
    g2: float | None = None  # smoothed |G|²
    trace: float | None = None  # smoothed tr Σ
    steps: int = 0
    effective_steps: float = 0.0
    needed: float = 0.0


class RatioEMA:
    """EMAs of |G|² and tr Σ with horizon ``window`` training steps (decay β = 1 − 1/window
    per step), or ``MEASURED_MEMORY`` measured steps when fewer than that fall in the window:
    a sparsely measured estimate keeps its precision and follows drift more slowly, instead of
    forgetting what it measured and vanishing."""

    def __init__(self, window: int, min_effective_steps: float = MIN_EFFECTIVE_STEPS) -> None:
        if window < 1:
            raise ValueError("window must be at least 1 step")
        self.window = window
        self.beta = 1.0 - 1.0 / window if window > 1 else 0.0
        self.slowest = 1.0 - 1.0 / MEASURED_MEMORY  # the least decay per measured step
        # at most (1+β)/(1−β) effective steps can ever be reached
        reachable = (1 + self.beta) / (1 - self.beta)
        self.needed = min(min_effective_steps, 0.9 * reachable)
        self.reset()

    def reset(self) -> None:
        self.steps = 0
        self.w = 0.0  # Σ w
        self.w2 = 0.0  # Σ w²
        self.mean_g = 0.0
        self.mean_s = 0.0
        self.m2_g = 0.0  # Σ w (g − ḡ)²  (decayed Welford co-moments)
        self.m2_s = 0.0
        self.c_gs = 0.0

    def update(self, g2: float, trace: float, steps: int = 1) -> None:
        """Fold in one measured step; ``steps`` training steps passed since the last one, so
        the horizon stays ``window`` training steps when not every step is measured (and at
        least ``MEASURED_MEMORY`` measured steps)."""
        beta = max(self.beta ** max(1, steps), min(self.beta, self.slowest))
        self.steps += 1
        self.w = beta * self.w + 1.0
        self.w2 = beta * beta * self.w2 + 1.0
        dg = g2 - self.mean_g
        ds = trace - self.mean_s
        self.mean_g += dg / self.w
        self.mean_s += ds / self.w
        self.m2_g = beta * self.m2_g + dg * (g2 - self.mean_g)
        self.m2_s = beta * self.m2_s + ds * (trace - self.mean_s)
        self.c_gs = beta * self.c_gs + ds * (g2 - self.mean_g)

    @property
    def effective_steps(self) -> float:
        return self.w * self.w / self.w2 if self.w2 else 0.0

    def _mean_covariance(self) -> tuple[float, float, float]:
        """Var(mean tr Σ), Var(mean |G|²), Cov of the two means."""
        if self.steps < 2:
            return math.inf, math.inf, 0.0
        denominator = self.w - self.w2 / self.w  # reliability-weights correction
        if denominator <= 0:
            return math.inf, math.inf, 0.0
        factor = (self.w2 / (self.w * self.w)) / denominator
        return self.m2_s * factor, self.m2_g * factor, self.c_gs * factor

    def estimate(self, z: float = Z95) -> Estimate:
        n_eff = self.effective_steps
        base = Estimate(
            g2=self.mean_g if self.steps else None,
            trace=self.mean_s if self.steps else None,
            steps=self.steps,
            effective_steps=n_eff,
            needed=self.needed,
        )
        if self.steps == 0 or n_eff < self.needed:
            return base
        v_s, v_g, c = self._mean_covariance()
        m_s, m_g = self.mean_s, self.mean_g
        se_g = math.sqrt(max(v_g, 0.0))
        significant = m_g > z * se_g and m_s > 0
        if not significant:
            upper_g = m_g + z * se_g
            lower = m_s / upper_g if m_s > 0 and upper_g > 0 else None
            return _replace(base, lower_bound=lower)
        ratio = m_s / m_g
        var_ratio = max(v_s - 2 * ratio * c + ratio * ratio * v_g, 0.0) / (m_g * m_g)
        low, high = _fieller((m_s, m_g), (v_s, v_g, c), z)
        return _replace(
            base,
            b_simple=ratio,
            stderr=math.sqrt(var_ratio),
            ci_low=low,
            ci_high=high,
        )


def _fieller(
    means: tuple[float, float], covariance: tuple[float, float, float], z: float
) -> tuple[float | None, float | None]:
    """The 95% interval of m_s/m_g: the R with (m_s − R·m_g)² ≤ z²·Var(m_s − R·m_g)."""
    m_s, m_g = means
    v_s, v_g, c = covariance
    z2 = z * z
    a = m_g * m_g - z2 * v_g
    b = m_s * m_g - z2 * c
    cc = m_s * m_s - z2 * v_s
    disc = b * b - a * cc
    if a <= 0 or disc < 0:
        return None, None
    root = math.sqrt(disc)
    return max((b - root) / a, 0.0), (b + root) / a


def _replace(base: Estimate, **changes: object) -> Estimate:
    fields = {name: getattr(base, name) for name in Estimate.__slots__}
    fields.update(changes)
    return Estimate(**fields)  # type: ignore[arg-type]
