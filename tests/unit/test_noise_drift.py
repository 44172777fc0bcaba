"""Following a drifting B_simple (probes/noise/drift.py): restarts when it moved, none when
it holds still."""

from __future__ import annotations

import numpy as np
import pytest

from bsmon.probes.noise.drift import DriftFollowingRatio
from bsmon.probes.noise.smoothing import RatioEMA


def stream(averages, steps: int, g2: float, rng, gap: int = 1, noise: float = 0.5) -> None:
    """``steps`` measured steps of B_simple 50/g2 · g2… i.e. tr Σ 50, |G|² ``g2``, with
    heavy-tailed (Student t, 3 degrees of freedom) per-step noise."""
    for a, b in rng.standard_t(3, size=(steps, 2)) / np.sqrt(3):
        averages.update(g2 * (1 + noise * a), 50.0 * (1 + 0.3 * b), steps=gap)


@pytest.mark.parametrize(("gap", "noise"), [(1, 0.5), (1, 2.0), (50, 0.5), (50, 2.0)])
def test_no_restart_while_b_simple_holds_still(gap, noise):
    restarts = 0
    for seed in range(5):
        follower = DriftFollowingRatio(window=1000)
        stream(follower, 3000, 1.0, np.random.default_rng(seed), gap, noise)
        restarts += follower.restarts
        estimate = follower.estimate()
        assert abs(estimate.b_simple - 50) <= 4 * estimate.stderr
    assert restarts <= 1


@pytest.mark.parametrize(("gap", "after"), [(1, 500), (50, 100)])
def test_a_jump_in_b_simple_is_followed_quickly(gap, after):
    """|G|² halves (B_simple doubles from 50 to 100) after 2,000 measured steps: two
    horizons of the fast averages later (500 steps measured every step; 100 measured steps
    50 apart, where they remember 25) the estimate is less than half as far from the new
    value as the slow averages alone."""
    follower, slow = DriftFollowingRatio(window=1000), RatioEMA(window=1000)
    for averages in (follower, slow):
        stream(averages, 2000, 1.0, np.random.default_rng(3), gap)
        stream(averages, after, 0.5, np.random.default_rng(4), gap)
    assert follower.restarts >= 1
    follower_gap = 100 - follower.estimate().b_simple
    slow_gap = 100 - slow.estimate().b_simple
    assert slow_gap > 20 and abs(follower_gap) < slow_gap / 2
    assert follower.mean_age < slow.mean_age / 2


def test_a_steady_drift_is_followed_closer_than_by_the_slow_averages():
    """B_simple rising 1% every 10 steps, every step measured: the slow averages read a
    window behind; the follower restarts as often as the difference shows and reads closer."""
    rng = np.random.default_rng(5)
    follower, slow = DriftFollowingRatio(window=1000), RatioEMA(window=1000)
    g2 = 1.0
    for step in range(6000):
        g2 = 0.999**step
        a, b = rng.standard_t(3, size=2) / np.sqrt(3)
        for averages in (follower, slow):
            averages.update(g2 * (1 + 0.5 * a), 50.0 * (1 + 0.3 * b))
    truth = 50.0 / g2
    follower_error = abs(follower.estimate().b_simple / truth - 1)
    slow_error = abs(slow.estimate().b_simple / truth - 1)
    assert follower.restarts >= 1
    assert follower_error < slow_error / 2


@pytest.mark.parametrize("gap", [1, 10])
def test_a_young_runs_falling_gradient_is_followed(gap):
    """|G|² falling as 1/t (B_simple = 50·t, 30× over the run), every step measured for the
    first 300 and then one in ``gap``: averages reaching back to the first steps read a
    fifth of B_simple or less (their large |G|² dominates the mean); the horizon bounded by
    the run's age reads at least half of it at every checkpoint."""
    rng = np.random.default_rng(0)
    follower, last = DriftFollowingRatio(window=1000), 0
    for step in range(1, 3001):
        if step <= 300 or step % gap == 0:
            a, b = rng.standard_t(3, size=2) / np.sqrt(3)
            follower.update((1 + 0.5 * a) / step, 50.0 * (1 + 0.3 * b), steps=step - last)
            last = step
        if step in (100, 400, 1000, 3000):
            assert 0.5 <= follower.estimate().b_simple / (50.0 * step) <= 1.3, step
