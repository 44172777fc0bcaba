"""Smoothing: the ratio of two exponential moving averages, with its uncertainty.

Per-step estimates of |G|² are often negative (≈20% of steps even at B_simple ≈ 2B), so the
per-step ratio has no usable mean (research note §1.5). bsmon keeps exponentially weighted
means of |G|² and of tr Σ separately — bias-corrected, i.e. normalised by the sum of the
weights — and reports their ratio. The weighted (co)variances of the per-step values, kept
with a decayed weighted Welford update (numerically stable), give the standard error of the
ratio by the delta method and a 95% interval by Fieller's theorem; the effective number of
steps is (Σw)²/Σw². The ratio's second-order bias is left in: it makes the *mean* of the
ratio read high when the averages hold few steps (+3.9% at 40 steps of a noisy |G|²), but its
*median* is unbiased, and removing the first made the second read 4% low.

Until the window holds enough steps, or while the mean |G|² is not significantly above zero,
there is no point estimate: ``b_simple`` is None and, when it can be said, ``lower_bound`` is
tr Σ / (|G|² + z·se), i.e. "B_simple is at least this".

When a cost budget measures few steps, a horizon in training steps alone would hold too few
measured ones; the averages then remember as many measured steps as keep the relative
standard error near ``TRACKING_RSE`` (many when the per-step values are noisy), never fewer
than ``MIN_MEMORY``.

Early in a run B_simple moves on the time scale of the run itself (it grew 30× over the first
3,000 steps of a small character model), while |G|² falls: averages reaching back to the
first steps then read far below it, since those steps' large |G|² dominates the mean. So the
horizon never reaches back more than ``AGE_SHARE`` of the training steps the averages have
been fed, nor keeps fewer than ``AGED_EFFECTIVE`` effective steps (an estimate needs 30, and
the first one comes as early as before): precision is given up only while the run is young.
Following a later drift is drift.py's job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Z95 = 1.959963984540054
MIN_EFFECTIVE_STEPS = 30
TRACKING_RSE = 0.15  # the precision a sparsely measured estimate keeps (warm-up ends at 20%)
MIN_MEMORY, MAX_MEMORY = 100, 1000  # measured steps the averages remember, at least / at most
AGE_SHARE = 0.25  # the horizon reaches back at most this share of the steps fed so far ...
AGED_EFFECTIVE = 40  # ... keeping at least this many effective steps


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
    per step), or ``memory`` measured steps when fewer than that fall in the window: a
    sparsely measured estimate keeps its precision instead of forgetting what it measured and
    vanishing. ``memory`` follows the per-step spread of the values (``TRACKING_RSE``): the
    weights depend on how noisy past steps were, never on which steps were measured."""

    def __init__(
        self,
        window: int,
        min_effective_steps: float = MIN_EFFECTIVE_STEPS,
        memory_scale: float = 1.0,
    ) -> None:
        """``memory_scale``: remember this share of the measured steps the precision goal
        asks for (a fast pair of averages beside a slow one)."""
        if window < 1:
            raise ValueError("window must be at least 1 step")
        self.window = window
        self.memory_scale = memory_scale
        self.beta = 1.0 - 1.0 / window if window > 1 else 0.0
        # at most (1+β)/(1−β) effective steps can ever be reached
        reachable = (1 + self.beta) / (1 - self.beta)
        self.needed = min(min_effective_steps, 0.9 * reachable)
        self.reset()

    def reset(self) -> None:
        self.steps = 0
        self.elapsed = 0  # training steps since the first update
        self.memory = MIN_MEMORY * self.memory_scale
        self.w = 0.0  # Σ w
        self.w2 = 0.0  # Σ w²
        self.age = 0.0  # Σ w · (training steps since that measured step)
        self.g_log_step = 0.0  # Σ w · |G|² · ln(training step): see log_step
        self.relative: float | None = None  # (se / B_simple)² at the latest update
        self.mean_g = 0.0
        self.mean_s = 0.0
        self.m2_g = 0.0  # Σ w (g − ḡ)²  (decayed Welford co-moments)
        self.m2_s = 0.0
        self.c_gs = 0.0

    def update(self, g2: float, trace: float, steps: int = 1, at: int | None = None) -> None:
        """Fold in one measured step; ``steps`` training steps passed since the last one, so
        the horizon stays ``window`` training steps when not every step is measured (and at
        least ``memory`` measured steps); ``at``: its training step, if known."""
        steps = max(1, steps)
        self.elapsed += steps
        slowest = 1.0 - 1.0 / self.memory  # the least decay per measured step
        beta = max(self.beta**steps, min(self.beta, slowest))
        beta = min(beta, max(self._young_decay(steps), self._least_decay()))
        self.steps += 1
        self.age = beta * (self.age + steps * self.w)
        at_log = math.log(at) if at is not None and at >= 1 else math.nan  # nan: never known
        self.g_log_step = beta * self.g_log_step + g2 * at_log
        self.w = beta * self.w + 1.0
        self.w2 = beta * beta * self.w2 + 1.0
        dg = g2 - self.mean_g
        ds = trace - self.mean_s
        self.mean_g += dg / self.w
        self.mean_s += ds / self.w
        self.m2_g = beta * self.m2_g + dg * (g2 - self.mean_g)
        self.m2_s = beta * self.m2_s + ds * (trace - self.mean_s)
        self.c_gs = beta * self.c_gs + ds * (g2 - self.mean_g)
        enough = self.effective_steps >= self.needed
        self.relative = self._relative_variance() if enough else None
        if self.relative is not None:
            self._follow_spread(self.relative)

    def _young_decay(self, steps: int) -> float:
        """The decay over ``steps`` training steps of a horizon of ``AGE_SHARE`` of the steps
        fed so far (0: so young that nothing before this step is kept)."""
        horizon = AGE_SHARE * self.elapsed
        return (1.0 - 1.0 / horizon) ** steps if horizon > 1 else 0.0

    def _least_decay(self) -> float:
        """The smallest decay that leaves the averages ``AGED_EFFECTIVE`` effective steps
        after this update and keeps them at the next ones (1: they hold no more than that
        yet, so nothing is let go). The root of (βw + 1)² = F(β²w₂ + 1) keeps F now; but a
        mass of weight below (F + 1)/2, an EMA's at F effective steps, would let each later
        step weigh more than an EMA's, and the count sink below F (at 4·B0 on the autopilot
        benchmark's T1 it fell to 29.7, and the estimate, which needs 30, vanished for 400
        steps), so the mass is kept at (F + 1)/2 at least."""
        w, w2, floor = self.w, self.w2, AGED_EFFECTIVE
        a = w * w - floor * w2
        if a <= 0:
            return 1.0
        root = (math.sqrt(w * w + a * (floor - 1)) - w) / a
        return min(max(root, (floor - 1) / (2 * w)), 1.0)

    def _follow_spread(self, relative: float) -> None:
        """Remember as many measured steps as keep the relative standard error at
        ``TRACKING_RSE``: (per-step relative variance) / TRACKING_RSE² effective steps, which
        an EMA of memory M holds 2M − 1 of."""
        per_step = relative * self.effective_steps
        wanted = min(max((per_step / TRACKING_RSE**2 + 1) / 2, MIN_MEMORY), MAX_MEMORY)
        self.memory = max(wanted * self.memory_scale, (self.needed + 1) / 2)

    def forget(self) -> None:
        """Drop what the averages hold, keeping their horizon and count of steps."""
        steps, memory, elapsed = self.steps, self.memory, self.elapsed
        self.reset()
        self.steps, self.memory, self.elapsed = steps, memory, elapsed

    def log_ratio(self) -> tuple[float, float] | None:
        """ln B_simple and its variance as of the latest update, once there is an estimate;
        else None."""
        if self.relative is None:
            return None
        return math.log(self.mean_s / self.mean_g), self.relative

    @property
    def mean_age(self) -> float:
        """How many training steps before the latest measured one the averages' steps lie,
        on average (window − 1 when every step is measured): how far behind a drift they
        read."""
        return self.age / self.w if self.w else 0.0

    @property
    def log_step(self) -> float | None:
        """The step the ratio stands for, as a logarithm: the mean of ln(step) weighted by
        each step's weight times its |G|². The ratio Σw·trΣ / Σw·|G|² is B_simple averaged
        with those weights, so while B_simple moves as a power of the step this is where it
        reads it (early steps, whose |G|² is large, pull it back further than the mean age
        says). None while the averaged |G|² is not above zero, or when a step came without its
        training step."""
        mass = self.mean_g * self.w
        if not mass > 0 or math.isnan(self.g_log_step):
            return None
        return self.g_log_step / mass

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

    def _relative_variance(self, z: float = Z95) -> float | None:
        """(se / B_simple)² by the delta method, or None while |G|² is not significantly
        above zero."""
        v_s, v_g, c = self._mean_covariance()
        m_s, m_g = self.mean_s, self.mean_g
        if not (m_g > z * math.sqrt(max(v_g, 0.0)) and m_s > 0):
            return None
        return max(v_s / (m_s * m_s) - 2 * c / (m_s * m_g) + v_g / (m_g * m_g), 0.0)

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
        relative = self._relative_variance(z)
        if relative is None:
            upper_g = m_g + z * math.sqrt(max(v_g, 0.0))
            lower = m_s / upper_g if m_s > 0 and upper_g > 0 else None
            return _replace(base, lower_bound=lower)
        ratio = m_s / m_g
        low, high = _fieller((m_s, m_g), (v_s, v_g, c), z)
        return _replace(
            base,
            b_simple=ratio,
            stderr=ratio * math.sqrt(relative),
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
