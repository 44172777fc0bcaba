"""Following a drifting B_simple without giving up precision while it holds still.

B_simple grows as training goes on, while the averages that make the estimate precise
remember many steps (a thousand training steps, or more where a cost budget measures few).
Beside them runs a fast pair of averages with a quarter of the horizon; when the two
estimates disagree by more than their noise explains (``SHIFT_Z`` standard errors of the
difference of their logarithms), B_simple has moved: the slow averages start again from the
steps after the move, and until they hold enough of them the fast ones are shown. While
B_simple holds still the two rarely disagree, and the estimate keeps its full precision. The
decision looks at the averaged values, never at which steps are measured.

Both pairs take each step divided by the level of |G|² around it (``GradientLevel``). Early
in a run |G|² falls tenfold or more over a few hundred steps, and a plain average of
tr Σ and of |G|² is then B_simple averaged with weights ∝ |G|²: the first steps, where it was
smallest, dominate (the ratio of averages reads far below B_simple, and further back than
the horizon says). Scaled, every step weighs by its place in the horizon alone, and the
ratio is unchanged where |G|² holds still. Replayed on the per-step values of the autopilot
benchmark's T2 with every step measured for the first 64 and then one in 25, the median
reading over steps 64–3,900 went from 0.37 of a centred window's value to 0.91 (T1: 0.67 to
0.71; the closed-form regression's error unchanged).
"""

from __future__ import annotations

import math

from .smoothing import Estimate, RatioEMA

FAST = 4  # the fast averages' horizon is this many times shorter
SHIFT_Z = 3.0
LEVEL_MEMORY = 32  # measured steps the level of |G|² that scales each step remembers ...
LEVEL_YOUNG = 0.5  # ... but never more than half of those measured so far


class GradientLevel:
    """How large |G|² is around now: an EMA of the measured steps' |G|², bias-corrected,
    remembering ``LEVEL_MEMORY`` of them (half of those seen, while fewer). Each step is
    divided by the level from *before* it (a level that included the step would
    down-weight the steps that read high, and bias B_simple up)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.value: float | None = None
        self.count = 0
        self.scale = 1.0  # the latest positive level

    def take(self, g2: float) -> float:
        """The scale for a step with |G|² ``g2``, then fold ``g2`` into the level."""
        if self.value is not None and self.value > 0:
            self.scale = self.value
        elif self.value is None and g2 > 0:
            self.scale = g2  # the first step is its own scale: the ratio is what counts
        scale = self.scale
        self.count += 1
        keep = 1.0 - 1.0 / min(LEVEL_MEMORY, max(1.0, LEVEL_YOUNG * self.count))
        self.value = g2 if self.value is None else keep * self.value + (1 - keep) * g2
        return scale


class DriftFollowingRatio:
    """``RatioEMA``'s estimate, started again when a fast pair of averages shows that
    B_simple moved."""

    def __init__(self, window: int) -> None:
        self.slow = RatioEMA(window)
        self.fast = RatioEMA(max(1, window // FAST), memory_scale=1 / FAST)
        self.level = GradientLevel()
        self.restarts = 0

    def reset(self) -> None:
        self.slow.reset()
        self.fast.reset()
        self.level.reset()
        self.restarts = 0

    def update(self, g2: float, trace: float, steps: int = 1, at: int | None = None) -> None:
        scale = self.level.take(g2)
        g2, trace = g2 / scale, trace / scale
        self.slow.update(g2, trace, steps, at, scale)
        self.fast.update(g2, trace, steps, at, scale)
        if self._moved():
            self.slow.forget()
            self.restarts += 1

    def _moved(self) -> bool:
        slow, fast = self.slow.log_ratio(), self.fast.log_ratio()
        if slow is None or fast is None:
            return False
        (slow_log, slow_var), (fast_log, fast_var) = slow, fast
        # the fast steps are part of the slow ones, so the sum overstates the difference's
        # variance: a conservative test
        return abs(fast_log - slow_log) > SHIFT_Z * math.sqrt(slow_var + fast_var)

    @property
    def _shown(self) -> RatioEMA:
        refilling = self.restarts and self.slow.effective_steps < self.slow.needed
        return self.fast if refilling else self.slow

    def estimate(self) -> Estimate:
        return self._shown.estimate()

    @property
    def mean_age(self) -> float:
        return self._shown.mean_age

    @property
    def log_step(self) -> float | None:
        return self._shown.log_step
