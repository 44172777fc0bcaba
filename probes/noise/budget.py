"""Which steps the noise scale measures: a cost budget priced from the hooks' own time and
from how much longer measured steps really take. Timing only, never the gradients."""

from __future__ import annotations

import math
import os
import statistics
from collections import deque

BUDGET_VARIABLE = "BSMON_NOISE_BUDGET"
EVERY_STEP = "all"


def budget_from_environment(
    given: float | None, text: str | None = None
) -> tuple[float | None, str | None]:
    """``BSMON_NOISE_BUDGET`` fixes the budget for diagnostics and tests, over ``attach()``'s
    ``noise_budget`` (``given``), where ``bsmon run`` gives no way to pass it: ``all``
    measures every step, a number in (0, 1] is the share of the step time. Returns the budget
    and, when the variable is set but wrong, why it is ignored."""
    text = os.environ.get(BUDGET_VARIABLE) if text is None else text
    if not text:
        return given, None
    if text.strip().lower() == EVERY_STEP:
        return None, None
    try:
        share = float(text)
    except ValueError:
        share = math.nan
    if not 0 < share <= 1:
        kept = "every step" if given is None else f"{given:g}"
        why = f"{BUDGET_VARIABLE}={text!r} is not {EVERY_STEP!r} or a share in (0, 1]"
        return given, f"{why}; using {kept}"
    return share, None


class RecentMedian:
    """The median of the last ``n`` values, refreshed every ``every`` values once there are
    more than ``every`` (before, at each): the step that pays for sorting them comes once in
    ``every``, not on every step."""

    def __init__(self, n: int, every: int = 8) -> None:
        self.values: deque[float] = deque(maxlen=n)
        self.every = every
        self.median: float | None = None
        self._since = 0

    def add(self, value: float) -> None:
        self.extend([value])

    def extend(self, values: list[float]) -> None:
        """Several values at once: the median refreshed once, if it is due by the end."""
        if not values:
            return
        self.values.extend(values[-self.values.maxlen :] if self.values.maxlen else values)
        self._since += len(values)
        if self._since >= self.every or len(self.values) <= self.every:
            self.median = statistics.median(self.values)
            self._since = 0

    def __len__(self) -> int:
        return len(self.values)


class Budget:
    """Chooses the steps to measure so that measuring costs about ``fraction`` of the step
    time on average: a token bucket credited ``fraction × step time`` per step and debited the
    price of each measured step.

    The price starts as the host time spent in bsmon's hooks (on the CPU that is the norm
    computations themselves; on a GPU, their launches). Measured steps also cost something
    outside the hooks' own code (autograd calling them, caches), so once enough steps of both
    kinds have been seen the price is how much longer the median measured step takes than the
    median other one — kept between 1x and 3x the hooks' own time, so a burst of noise in the
    step times can neither hide the cost nor stop the measurements. Which steps are measured
    depends on timing, never on the gradients, so the estimate stays unbiased; only its
    variance grows."""

    SAMPLES = 32  # recent step durations of each kind
    MIN_SAMPLES = 5

    def __init__(self, fraction: float | None) -> None:
        self.fraction = fraction
        self.credit = 0.0
        self.costs = RecentMedian(self.SAMPLES)  # host time in the hooks per measured step
        self.measured_times = RecentMedian(self.SAMPLES)
        self.plain_times = RecentMedian(self.SAMPLES)
        self.share = 1.0  # smoothed share of steps measured

    @property
    def limited(self) -> bool:
        """Whether it measures only some steps (False: every one, ``noise_budget=None``)."""
        return self.fraction is not None and self.fraction < 1

    @property
    def cost(self) -> float | None:
        """The hooks' host time on a recent measured step (the median: a layer's first calls,
        which time two methods, do not raise it)."""
        return self.costs.median

    @property
    def plain_step_s(self) -> float | None:
        """A recent step's time when the estimator did not measure it (None: too few seen)."""
        plain = self.plain_times
        return plain.median if len(plain) >= self.MIN_SAMPLES else None

    @property
    def price(self) -> float | None:
        cost = self.cost
        if cost is None:
            return None
        measured, plain = self.measured_times, self.plain_times
        if min(len(measured), len(plain)) < self.MIN_SAMPLES:
            return cost
        extra = measured.median - plain.median  # type: ignore[operator]
        return min(max(extra, cost), 3 * cost)

    def add_duration(self, measured: bool, duration: float | None) -> None:
        """A step's duration (agent thread): a measured one, or another."""
        if duration is not None and duration > 0:
            (self.measured_times if measured else self.plain_times).add(duration)

    def add_durations(self, measured: list[float], plain: list[float]) -> None:
        """Steps' durations (agent thread): measured ones, and the others."""
        self.measured_times.extend(measured)
        self.plain_times.extend(plain)

    def gap(
        self,
        measured: bool,
        cost: float,
        step_time: float | None,
        steps: int = 1,
        free: bool = False,
    ) -> int:
        """At a step the estimator saw (``cost`` of it in the hooks; ``steps`` since the last
        call, this one included): how many steps ahead the next one to measure is (1: the
        next). ``free``: the step was measured outside the budget (the warm-up): learn its
        price, charge nothing. The bucket is credited for every step in between, so calling
        this only at measured steps decides exactly as calling it at every step would."""
        if measured and cost > 0:
            self.costs.add(cost)
        fraction, price = self.fraction, self.price
        base = self.plain_times.median or step_time
        if fraction is None or fraction >= 1 or not base or price is None:
            ahead = 1
        else:
            per_step = fraction * base
            self.credit += per_step * steps - (price if measured and not free else 0.0)
            self.credit = min(self.credit, 2 * price)  # no bursts after a long pause
            short = price - self.credit
            ahead = 1 if short <= 0 else 1 + math.ceil(short / per_step)
        keep = 0.98**steps
        self.share = keep * self.share + (1 - keep) * (measured / steps)
        return ahead

    def next(
        self,
        measured: bool,
        cost: float,
        step_time: float | None,
        duration: float | None = None,
        free: bool = False,
    ) -> bool:
        """Called at every step (``duration`` long): measure the next one?"""
        self.add_duration(measured, duration)
        return self.gap(measured, cost, step_time, 1, free) == 1
