"""The noise-scale estimator math, the smoother, the cost budget and the hand-off, alone."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from bsmon.probes.noise import ddp, estimators
from bsmon.probes.noise.budget import Budget
from bsmon.probes.noise.estimators import EstimateError, Units, components
from bsmon.probes.noise.sequential import pair_terms
from bsmon.probes.noise.smoothing import AGED_EFFECTIVE, MIN_MEMORY, TRACKING_RSE, RatioEMA
from bsmon.probes.noise.step_record import capture, read


def test_per_example_form_is_the_u_statistic():
    """|𝒢|² = (B|ḡ|² − mean|g_i|²)/(B−1) and 𝒮 = (mean|g_i|² − |ḡ|²)·B/(B−1) (note §1.4)."""
    rng = np.random.default_rng(0)
    g = rng.standard_normal((16, 5)) + 0.3  # per-example gradients
    c = g / 16  # their contributions to a mean-reduced gradient
    step = estimators.per_example(float((c**2).sum()), float((c.sum(0) ** 2).sum()), 16)
    mean_sq, bar_sq = (g**2).sum(1).mean(), (g.mean(0) ** 2).sum()
    assert step.g2 == pytest.approx((16 * bar_sq - mean_sq) / 15)
    assert step.trace == pytest.approx(np.trace(np.cov(g.T)))  # unbiased sample covariance


def test_micro_batch_form_is_eq_a2_and_ignores_the_loss_scale():
    rng = np.random.default_rng(1)
    k, b = 4, 8
    micro_means = rng.standard_normal((k, 6)) + 0.5
    big = micro_means.mean(0)
    small_sq = (micro_means**2).sum(1).mean()
    expected_g2 = (k * b * (big**2).sum() - b * small_sq) / (k * b - b)
    expected_s = (small_sq - (big**2).sum()) / (1 / b - 1 / (k * b))
    for factor in (1.0, 1 / k, 37.0):  # mean, mean/k, any fixed scale of the loss
        c = micro_means / k * factor
        step = components(float((c.sum(0) ** 2).sum()), k * b, [Units(float((c**2).sum()), k, b)])
        assert step.trace / step.g2 == pytest.approx(expected_s / expected_g2)
    c = micro_means / k
    step = components(float((c.sum(0) ** 2).sum()), k * b, [Units(float((c**2).sum()), k, b)])
    assert (step.g2, step.trace) == (pytest.approx(expected_g2), pytest.approx(expected_s))


def test_unequal_micro_batches_stay_unbiased():
    """Units of different sizes: every term of the average is unbiased on its own."""
    rng = np.random.default_rng(2)
    sizes = [5, 7, 12]
    n, d = sum(sizes), 3
    g_true, sigma = np.array([0.3, -0.2, 0.1]), 1.0
    g2s, traces = [], []
    for _ in range(20000):
        examples = g_true + sigma * rng.standard_normal((n, d))
        c = examples / n
        bounds = np.cumsum([0, *sizes])
        units = [
            Units(float((c[a:z].sum(0) ** 2).sum()), 1, z - a)
            for a, z in itertools.pairwise(bounds)
        ]
        step = components(float((c.sum(0) ** 2).sum()), n, units)
        g2s.append(step.g2)
        traces.append(step.trace)
    assert np.mean(g2s) == pytest.approx((g_true**2).sum(), rel=0.05)
    assert np.mean(traces) == pytest.approx(d * sigma**2, rel=0.02)


def test_noiseless_units_give_zero_trace():
    c = np.array([[0.5, 0.25]] * 4)
    step = components(float((c.sum(0) ** 2).sum()), 4, [Units(float((c**2).sum()), 4, 1)])
    assert step.trace == pytest.approx(0, abs=1e-12)
    assert step.g2 == pytest.approx(float((c.sum(0) ** 2).sum()))


def test_a_unit_as_large_as_the_step_cannot_be_used():
    with pytest.raises(EstimateError, match="cannot be compared"):
        components(1.0, 8, [Units(1.0, 1, 8)])
    with pytest.raises(EstimateError):
        components(1.0, 8, [])


def test_two_consecutive_steps_are_two_micro_batches():
    g1, g2 = np.array([1.0, 2.0]), np.array([0.5, 1.0])
    total, unit_sq = pair_terms(float(g1 @ g1), float(g2 @ g2), float((g1 - g2) @ (g1 - g2)))
    step = components(total, 20, [Units(unit_sq, 2, 10)])
    assert step.g2 == pytest.approx(float(g1 @ g2))  # the pair estimate of |G|² is g₁·g₂
    assert step.trace == pytest.approx(10 * float((g1 - g2) @ (g1 - g2)) / 2)


# -- smoothing ---------------------------------------------------------------------------------


def feed(ema: RatioEMA, steps: int, g2: float, trace: float, noise: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        ema.update(g2 + noise * rng.standard_normal(), trace + noise * rng.standard_normal())


def test_nothing_is_shown_before_enough_effective_steps():
    ema = RatioEMA(window=1000)
    feed(ema, 20, 1.0, 50.0, 0.1)
    est = ema.estimate()
    assert est.b_simple is None and est.steps == 20 and est.needed == 30
    feed(ema, 11, 1.0, 50.0, 0.1, seed=1)
    est = ema.estimate()  # 31 measured steps hold 30 effective: a young run lets none go early
    assert est.effective_steps >= 30 and est.b_simple == pytest.approx(50, rel=0.02)
    assert est.ci_low < est.b_simple < est.ci_high and est.stderr > 0


def test_a_short_window_needs_fewer_steps():
    ema = RatioEMA(window=5)  # at most 9 effective steps can ever be reached
    assert ema.needed < 9
    feed(ema, 50, 1.0, 10.0, 0.01)
    assert ema.estimate().b_simple == pytest.approx(10, rel=0.01)


def test_an_unresolved_gradient_gives_a_lower_bound_not_a_number():
    ema = RatioEMA(window=1000)
    feed(ema, 200, 0.01, 50.0, 1.0)  # |G|² far below its noise
    est = ema.estimate()
    assert est.b_simple is None and est.stderr is None
    assert est.lower_bound is not None and 0 < est.lower_bound < 50 / 0.01


def test_ratio_of_averages_not_average_of_ratios():
    """Per-step |G|² that is often negative still gives the right ratio (note §1.5)."""
    ema = RatioEMA(window=100_000)
    rng = np.random.default_rng(3)
    for _ in range(20000):
        ema.update(0.1 + 0.12 * rng.standard_normal(), 11.1 + 2.3 * rng.standard_normal())
    assert ema.estimate().b_simple == pytest.approx(111, rel=0.05)


def test_the_horizon_is_in_training_steps_when_steps_are_skipped():
    every, sparse = RatioEMA(window=1000), RatioEMA(window=1000)
    for i in range(4000):
        every.update(1.0 if i < 3000 else 2.0, 10.0)
        if i % 4 == 3:  # 250 measured steps per window: more than MEASURED_MEMORY
            sparse.update(1.0 if i < 3000 else 2.0, 10.0, steps=4)
    # both forget the first 3000 steps at the same rate
    assert sparse.estimate().g2 == pytest.approx(every.estimate().g2, rel=0.05)


def test_a_sparse_estimate_remembers_enough_measured_steps_to_stay():
    """Measured once in 50 steps (a tight cost budget), a 1000-step window would hold 20
    measured steps and the estimate would vanish; it keeps enough measured steps instead."""
    rng = np.random.default_rng(5)
    ema = RatioEMA(window=1000)
    for _ in range(400):
        ema.update(1.0 + 0.3 * rng.standard_normal(), 50.0 + 5 * rng.standard_normal(), steps=50)
    estimate = ema.estimate()
    assert estimate.effective_steps >= estimate.needed
    assert estimate.b_simple == pytest.approx(50, rel=0.1)


def sparse_stream(ema: RatioEMA, steps: int, g2: float, noise: float, rng) -> None:
    """``steps`` measured steps, one in 50 training steps, of B_simple 50 at |G|² ``g2``."""
    for _ in range(steps):
        ema.update(g2 * (1 + noise * rng.standard_normal()), 50.0 * g2, steps=50)


def test_a_young_horizon_keeps_its_effective_steps_when_measuring_turns_sparse():
    """Every step measured for 500 steps, then one in 100 (the warm-up, then the budget): as
    the horizon (a quarter of the run's steps) lets the dense steps go, the averages keep
    AGED_EFFECTIVE effective steps at every update, so the estimate, which needs 30, stays.
    Cut to a mass too light to hold them, they sank to about 30 and it vanished."""
    rng = np.random.default_rng(2)
    ema, counts = RatioEMA(window=1000), []
    for _ in range(500):
        ema.update(1.0 + 0.5 * rng.standard_normal(), 50.0 * (1 + 0.3 * rng.standard_normal()))
    for _ in range(60):
        ema.update(1.0 + 0.5 * rng.standard_normal(), 50.0 * (1 + 0.3 * rng.standard_normal()), 100)
        counts.append(ema.effective_steps)
        assert ema.estimate().b_simple == pytest.approx(50, rel=0.25)
    assert min(counts) >= AGED_EFFECTIVE - 1e-9


@pytest.mark.parametrize("noise", [0.5, 2.0, 4.0])
def test_a_sparse_estimate_keeps_its_precision_whatever_the_noise(noise):
    """However noisy the per-step values, the averages remember as many measured steps as
    keep the relative standard error near TRACKING_RSE (a fixed memory of 100 measured steps
    would read ±28% at the noisiest)."""
    rng = np.random.default_rng(7)
    ema = RatioEMA(window=1000)
    sparse_stream(ema, 3000, 1.0, noise, rng)
    estimate = ema.estimate()
    rse = estimate.stderr / estimate.b_simple
    assert 0.6 * TRACKING_RSE <= rse <= 1.35 * TRACKING_RSE or ema.memory == MIN_MEMORY
    assert estimate.b_simple == pytest.approx(50, rel=3 * TRACKING_RSE)


def test_the_mean_age_is_the_horizon_in_training_steps():
    every, sparse = RatioEMA(window=1000), RatioEMA(window=1000)
    feed(every, 20_000, 1.0, 50.0, 0.1)
    assert every.mean_age == pytest.approx(999, rel=0.01)
    rng = np.random.default_rng(9)
    sparse_stream(sparse, 2000, 1.0, 0.3, rng)  # MIN_MEMORY measured steps, 50 apart
    assert sparse.memory == MIN_MEMORY
    assert sparse.mean_age == pytest.approx(50 * (MIN_MEMORY - 1), rel=0.05)


def test_the_standard_error_is_calibrated():
    """Across independent runs, the truth lies within ±1.96 se about 95% of the time."""
    rng = np.random.default_rng(4)
    hits = 0
    for _ in range(60):
        ema = RatioEMA(window=500)
        g2 = 0.1 + 0.1 * rng.standard_normal(3000)
        trace = 11.1 + 2.0 * rng.standard_normal(3000)
        for a, b in zip(g2, trace, strict=True):
            ema.update(a, b)
        est = ema.estimate()
        hits += abs(est.b_simple - 111) <= 1.96 * est.stderr
    assert 0.85 <= hits / 60 <= 1.0


# -- budget and hand-off -----------------------------------------------------------------------


def test_the_budget_measures_the_share_of_steps_it_can_afford():
    budget = Budget(0.02)
    measured = 0
    decision = True
    for _ in range(5000):
        cost = 0.001 if decision else 0.0  # a measured step costs 1 ms, a step takes 10 ms
        decision = budget.next(decision, cost, step_time=0.010)
        measured += decision
    assert measured / 5000 == pytest.approx(0.2, abs=0.02)
    assert budget.share == pytest.approx(0.2, abs=0.1)


def test_the_budget_prices_what_measured_steps_really_cost():
    """The hooks report 1 ms, but measured steps run 2 ms longer than the others (autograd's
    dispatch of the hooks, caches): the budget goes by the 2 ms."""
    budget = Budget(0.02)
    measured = 0
    decision = True
    for _ in range(5000):
        duration = 0.012 if decision else 0.010
        decision = budget.next(decision, 0.001 if decision else 0.0, 0.010, duration)
        measured += decision
    assert budget.price == pytest.approx(0.002)
    assert measured / 5000 == pytest.approx(0.1, abs=0.015)


def test_the_budget_price_is_robust_to_outlying_step_times():
    budget = Budget(0.02)
    decision = True
    for i in range(3000):
        duration = 0.011 if decision else 0.010
        if i % 50 == 0:
            duration = 0.5  # an evaluation between two steps
        decision = budget.next(decision, 0.001 if decision else 0.0, 0.010, duration)
    assert budget.price == pytest.approx(0.001, rel=0.05)
    assert 0.15 <= budget.share <= 0.3


def test_no_budget_measures_every_step():
    budget = Budget(None)
    assert all(budget.next(True, 0.5, 0.010) for _ in range(100))
    assert all(Budget(1.0).next(True, 0.5, 0.010) for _ in range(10))


def test_capture_and_read_on_the_cpu():
    values = [torch.tensor(2.0), torch.tensor(3.0, dtype=torch.float64), torch.ones(())]
    captured = capture(values)
    assert read(captured) == [2.0, 3.0, 1.0]
    assert all(math.isfinite(v) for v in read(captured))


def test_the_ddp_source_reads_free_memory_at_most_every_few_seconds(monkeypatch):
    """Each measured DDP step asks whether a copy of the local gradient fits; the free memory
    behind the answer is read once per ROOM_FRESH_S, not on every step."""
    clock = SimpleNamespace(now=100.0)
    free = {"bytes": 10**9}
    reads = []

    def free_bytes(device):
        reads.append(clock.now)
        return free["bytes"]

    monkeypatch.setattr(ddp, "_free_bytes", free_bytes)
    monkeypatch.setattr(ddp, "time", SimpleNamespace(monotonic=lambda: clock.now))
    source = ddp.DDPSource.__new__(ddp.DDPSource)
    source._room, source._copy_bytes = None, 10**8
    cpu = torch.device("cpu")
    assert all(source._room_for_a_copy(cpu) for _ in range(100))
    assert reads == [100.0]
    free["bytes"] = 10**8  # the copy no longer fits in a quarter of it
    clock.now += ddp.ROOM_FRESH_S / 2
    assert source._room_for_a_copy(cpu)  # still the earlier reading
    clock.now += ddp.ROOM_FRESH_S
    assert not source._room_for_a_copy(cpu)
    assert len(reads) == 2


def test_a_gradient_below_zero_beyond_its_error_is_said_with_the_sources_reason():
    """Enough steps, |G|² significantly below zero (no estimate, no lower bound): why, in the
    source's words (BatchNorm for per-example norms); not while still collecting."""
    from bsmon.probes.noise.smoothing import Estimate
    from bsmon.probes.noise.tracker import Tracker

    tracker = Tracker(1000)
    below = Estimate(g2=-1.0, trace=5.0, effective_steps=40.0, needed=30.0)
    assert tracker._note(below, False, "BatchNorm couples them") == "BatchNorm couples them"
    collecting = Estimate(g2=-1.0, trace=5.0, effective_steps=12.0, needed=30.0)
    assert tracker._note(collecting, False, "BatchNorm couples them") is None
    bounded = Estimate(g2=0.1, trace=5.0, effective_steps=40.0, needed=30.0, lower_bound=20.0)
    assert tracker._note(bounded, False, "BatchNorm couples them") is None
