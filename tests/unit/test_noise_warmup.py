"""The noise scale's warm-up under its cost bound (probes/noise/warmup.py), driven with a
budget whose prices are known: what it spends over a run's first 300 steps, when it stops,
and what it says."""

from __future__ import annotations

import pytest

from bsmon.probes.noise.budget import Budget
from bsmon.probes.noise.warmup import (
    LIMIT,
    PRECISE,
    WARMUP_FIRST,
    WARMUP_LIMIT,
    WARMUP_SHARE,
    WARMUP_STEPS,
    WarmUp,
)


def priced(relative: float, step_s: float = 0.2) -> Budget:
    """A budget that has seen plain steps of ``step_s`` and measured ones ``relative`` of a
    step longer, with hooks costing that much."""
    budget = Budget(0.01)
    for _ in range(Budget.SAMPLES):
        budget.add_duration(False, step_s)
        budget.add_duration(True, step_s * (1 + relative))
        budget.gap(True, step_s * relative, step_s)
    return budget


def run(warmup: WarmUp, budget: Budget, steps: int, precise_at: int | None = None) -> list[int]:
    """The steps the warm-up measures (calling it only at the steps it names, as the
    controller does for per-example norms)."""
    measured, due = [], 1
    for step in range(1, steps + 1):
        if step != due:
            continue
        ahead = warmup.ahead(
            step, step in measured, budget, None, precise_at is not None and step >= precise_at
        )
        if ahead is None:
            break
        due = step + ahead
        if ahead and due <= steps:
            measured.append(due)
    return measured


@pytest.mark.parametrize("relative", [0.05, 0.2, 0.5, 1.0, 3.0])
def test_the_first_300_steps_cost_at_most_the_allowance(relative):
    warmup = WarmUp()
    measured = run(warmup, priced(relative), WARMUP_STEPS)
    spent = len(measured) * relative
    assert spent <= WARMUP_SHARE * WARMUP_STEPS + relative  # the last one may tip it over
    if relative <= 0.05:  # cheap: three steps in four, all along
        assert len(measured) >= 0.7 * WARMUP_STEPS
    else:  # dear: as many as the allowance buys, at the start
        assert len(measured) >= WARMUP_SHARE * WARMUP_STEPS / relative - 2
        bought = WARMUP_SHARE * WARMUP_STEPS / relative
        assert max(measured) <= WARMUP_FIRST + bought * 4 / 3 + 4


def test_the_runs_first_steps_are_left_alone():
    """The first 15 steps' |G|², the run's largest, would hold the averages back for hundreds
    of steps: the first step measured is the 16th, cheap or dear."""
    for relative in (0.01, 1.0):
        measured = run(WarmUp(), priced(relative), 60)
        assert min(measured) == WARMUP_FIRST == 16


def test_one_step_in_four_is_left_alone_to_price_the_others():
    measured = run(WarmUp(), priced(0.01), 60)
    left = [s for s in range(WARMUP_FIRST, 61) if s not in measured]
    assert left == list(range(WARMUP_FIRST + 4, 61, 4))


def test_after_the_300th_step_it_spends_four_percent_of_each_step():
    warmup = WarmUp()
    measured = run(warmup, priced(0.5), WARMUP_LIMIT + 100)
    late = [s for s in measured if s > WARMUP_STEPS]
    assert late, measured
    assert len(late) == pytest.approx((WARMUP_LIMIT - WARMUP_STEPS) * WARMUP_SHARE / 0.5, abs=2)
    assert warmup.ended == LIMIT
    said = warmup.describe()
    assert f"the warm-up measured {warmup.measured} steps in its {WARMUP_LIMIT}" in said
    assert "a measured step costs 50% of a step" in said


def test_a_precise_estimate_ends_it():
    warmup = WarmUp()
    measured = run(warmup, priced(0.1), WARMUP_STEPS, precise_at=60)
    assert warmup.ended == PRECISE and max(measured) <= 61
    assert warmup.describe() == ""


def test_fast_steps_may_spend_a_quarter_second():
    """1 ms steps: 300 of them take 0.3 s, and 4% of that (12 ms) would buy a dozen measured
    steps; the quarter-second floor keeps measuring three steps in four."""
    measured = run(WarmUp(), priced(1.0, step_s=0.001), WARMUP_STEPS)
    assert len(measured) >= 0.7 * WARMUP_STEPS


def test_it_says_what_a_measured_step_costs_when_that_limits_it():
    warmup = WarmUp()
    run(warmup, priced(2.0), 40)
    assert "a measured step costs 200% of a step, so at most 4% of the run's time" in (
        warmup.describe()
    )
    warmup = WarmUp()
    run(warmup, priced(0.01), 40)
    assert "3 steps in 4 measured" in warmup.describe()


def test_a_dearer_step_never_puts_the_next_measured_one_past_the_warm_ups_end():
    """The allowance spent early at a cheap price, then the price jumps (the batch grew 8×
    under the autopilot, and what was spent is priced at the current step): the next measured
    step is the warm-up's last, where the budget takes over, not thousands of steps on."""
    warmup = WarmUp()
    run(warmup, priced(0.01, step_s=0.001), 200)
    assert warmup.measured > 100
    step = 201
    ahead = warmup.ahead(step, True, priced(3.0), None, False)
    assert ahead is not None and 1 <= ahead <= WARMUP_LIMIT - step
    assert warmup.ahead(WARMUP_LIMIT, True, priced(3.0), None, False) is None
    assert warmup.ended == LIMIT
