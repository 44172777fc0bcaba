"""Following a drifting B_simple without giving up precision while it holds still.

B_simple grows as training goes on, while the averages that make the estimate precise
remember many steps (a thousand training steps, or more where a cost budget measures few).
Beside them runs a fast pair of averages with a quarter of the horizon; when the two
estimates disagree by more than their noise explains (``SHIFT_Z`` standard errors of the
difference of their logarithms), B_simple has moved: the slow averages start again from the
steps after the move, and until they hold enough of them the fast ones are shown. While
B_simple holds still the two rarely disagree, and the estimate keeps its full precision. The
decision looks at the averaged values, never at which steps are measured.
"""

from __future__ import annotations

import math

from .smoothing import Estimate, RatioEMA

FAST = 4  # the fast averages' horizon is this many times shorter
SHIFT_Z = 3.0


class DriftFollowingRatio:
    """``RatioEMA``'s estimate, started again when a fast pair of averages shows that
    B_simple moved."""

    def __init__(self, window: int) -> None:
        self.slow = RatioEMA(window)
        self.fast = RatioEMA(max(1, window // FAST), memory_scale=1 / FAST)
        self.restarts = 0

    def reset(self) -> None:
        self.slow.reset()
        self.fast.reset()
        self.restarts = 0

    def update(self, g2: float, trace: float, steps: int = 1, at: int | None = None) -> None:
        self.slow.update(g2, trace, steps, at)
        self.fast.update(g2, trace, steps, at)
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
