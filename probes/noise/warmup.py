"""The noise scale's warm-up: measure densely at the start of a run, under a cost bound.

An estimate needs tens of measured steps, and the cost budget alone (1% of the step time)
measures one step in tens to hundreds. So at the start the warm-up measures more, paid from
an **allowance**: ``WARMUP_SHARE`` (4%) of the time the run's steps take, counted as at least
``WARMUP_STEPS`` (300) steps from the start — so it may spend 12 step-times at once, and 4% of
every step after the 300th — and never less than ``WARMUP_FLOOR_S`` (a quarter of a second:
where 300 steps take a few seconds, what the warm-up costs goes unnoticed, and the old dense
warm-up is kept). While the allowance lasts it measures three steps in four (the
fourth is left alone, so that the price of a measured step is taken against plain ones);
once it is spent, the next measured step is the first the allowance covers, or the warm-up's
last if that comes first. What it has spent is the number of steps it measured times the
budget's current price of one, in plain step-times, so a price that turns out higher spaces
them out at once (a batch grown 8× makes every step it measured read 8× dearer: without the
cap on its last step, the autopilot's ramp put the next measured step 9,000 steps away).

It leaves the run's first ``WARMUP_FIRST - 1`` (15) steps alone. Their |G|² is the largest of
the run (on the tracking benchmark's transformer, 30× that of the steps around step 64), so
while the averages hold them their ratio stands for the first few steps, whatever was
measured since: with its first 34 measured steps taken from step 2 on, that transformer's
estimate read 0.12–0.23 of the exact value from step 64 to step 192, and the averages'
effective step stayed at 11–12. Replayed from every step's values with the same allowance
starting at step 16, it read 0.27–0.50 there and 0.73 of the exact value on median (0.34
before). A job attached mid-run loses 15 steps of its estimate's start.

It ends when the estimate reaches ±``WARMUP_RSE`` (20%), or ``WARMUP_LIMIT`` (500) steps after
the start; from then on the cost budget alone decides. The run's first 300 steps (and first
500) thus cost at most 4% of their time for the warm-up. Where a measured step costs little (a
micro-batch or DDP estimate, an MLP's per-example norms) the allowance pays for three steps
in four over most of the 300; where it costs half a step (a BatchNorm CNN's per-example
norms on a CPU) for the first 20–30, then one step in about 12 after the 300th.

Like the budget, it looks at timing and at the precision reached, never at a step's gradient,
so which steps are measured does not bias the estimate.
"""

from __future__ import annotations

import math

from .budget import Budget

WARMUP_RSE = 0.20  # the warm-up ends once B_simple's relative standard error is this
WARMUP_SHARE = 0.04  # the share of the run's time it may spend ...
WARMUP_STEPS = 300  # ... counting at least this many steps
WARMUP_LIMIT = 500  # it ends this many steps after the start, whatever the precision
WARMUP_FLOOR_S = 0.25  # ... but it may always spend this many seconds (fast steps: unnoticed)
PLAIN_EVERY = 4  # one step in this many is left unmeasured while the allowance lasts
WARMUP_FIRST = 16  # the first step of the run it measures

PRECISE, LIMIT = "precise", "limit"


class WarmUp:
    """The allowance and the rule; one per monitor. A restart of the estimate (a new source)
    restarts the warm-up, not the allowance: it is the run's time that it bounds."""

    def __init__(self, share: float = WARMUP_SHARE) -> None:
        self.share = share
        self.start = 0  # the step the estimate (re)started after
        self.measured = 0  # steps measured in the warm-up, over the run
        self.relative_price: float | None = None  # a measured step's extra, in plain steps
        self.step_s: float | None = None  # a plain step's time, when known
        self.ended: str | None = None  # PRECISE or LIMIT once it has ended
        self.limited = False  # the allowance, not the pattern, chose the next measured step

    @property
    def active(self) -> bool:
        return self.ended is None

    def restart(self, step: int) -> None:
        """The estimate starts again after ``step`` (a new source)."""
        self.start = step
        self.ended = None

    def allowance(self, step: int) -> float:
        """Plain step-times the warm-up may have spent by ``step``: ``share`` of at least
        ``WARMUP_STEPS`` steps, and never less than ``WARMUP_FLOOR_S`` seconds."""
        floor = WARMUP_FLOOR_S / self.step_s if self.step_s else 0.0
        return max(self.share * max(step, WARMUP_STEPS), floor)

    def spent(self) -> float:
        """Plain step-times spent so far, at the current price."""
        return self.measured * (self.relative_price or 0.0)

    def ahead(
        self,
        step: int,
        measured: bool,
        budget: Budget,
        step_time: float | None,
        precise: bool,
    ) -> int | None:
        """At step ``step`` (``measured`` or not): how many steps ahead the next measured one
        is while the warm-up lasts; None once it has ended (the budget decides)."""
        if self.ended is not None:
            return None
        if measured:
            self.measured += 1
        if precise:
            self.ended = PRECISE
        elif step - self.start >= WARMUP_LIMIT:
            self.ended = LIMIT
        if self.ended is not None:
            return None
        if step + 1 < WARMUP_FIRST:
            return WARMUP_FIRST - step
        price, self.step_s = _relative(budget, step_time)
        self.relative_price = price
        self.limited = price is not None and (
            (self.measured + 1) * price > self.allowance(step + 1)
        )
        if not self.limited:
            return 2 if (step + 1) % PLAIN_EVERY == 0 else 1
        # the first step the allowance covers: 4% of the steps since the start pays for it;
        # never past the warm-up's own end, where the budget takes over (what was spent is
        # priced at the current step: after the batch grew 8×, its steps at the small size
        # read 8× dearer, and the covering step could be thousands of steps away)
        covered = math.ceil((self.measured + 1) * price / self.share)  # type: ignore[operator]
        return min(max(covered, WARMUP_STEPS, step + 1), self.start + WARMUP_LIMIT) - step

    def describe(self) -> str:
        """What the warm-up is doing, or did when it ran out of steps, in a few words (the
        reading's detail); empty once it has ended with a precise estimate."""
        price = self.relative_price
        cost = f"a measured step costs {price:.0%} of a step" if price is not None else ""
        bound = f"at most {self.share:.0%} of the run's time"
        if self.ended == LIMIT:
            return (
                f"the warm-up measured {self.measured} steps in its {WARMUP_LIMIT} "
                f"({bound}{'; ' + cost if cost else ''})"
            )
        if self.ended is not None:
            return ""
        pace = f"{cost}, so {bound}" if self.limited else "3 steps in 4 measured"
        return f"warming up until ±{WARMUP_RSE:.0%}: {pace} ({self.measured} so far)"


def _relative(budget: Budget, step_time: float | None) -> tuple[float | None, float | None]:
    """The budget's price of a measured step in plain step-times, and a plain step's time
    in seconds (None: not known yet)."""
    price = budget.price
    if price is None:
        return None, None
    base = budget.plain_step_s
    if base is None and step_time:
        measured = budget.measured_times.median if len(budget.measured_times) else None
        # the steps so far were mostly measured: take the price off their time
        base = (measured or step_time) - price
    if not base or base <= 0:
        return None, None
    return price / base, base
