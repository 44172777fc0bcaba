"""Reading B_simple at the latest step while it grows (probes/noise/growth.py): the averages'
ratio carried forward by the growth their own history shows, the interval widened on the side
it may lag, and a B_simple that holds still left where it is."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bsmon.probes.noise.drift import DriftFollowingRatio
from bsmon.probes.noise.growth import GrowthCorrection, describe_growth
from bsmon.probes.noise.step_record import StepRecord
from bsmon.probes.noise.tracker import Tracker


def run(g2_at, steps: int, gap: int, seed: int, checkpoints: tuple[int, ...]):
    """Measured steps every ``gap`` (every step for the first 200, as the warm-up does) of
    tr Σ 50 and |G|² ``g2_at(step)``, heavy-tailed per-step noise; at each checkpoint the
    averages' own estimate and the corrected one."""
    rng = np.random.default_rng(seed)
    averages, growth = DriftFollowingRatio(window=1000), GrowthCorrection()
    last, found = 0, {}
    for step in range(1, steps + 1):
        if step <= 200 or step % gap == 0:
            a, b = rng.standard_t(3, size=2) / np.sqrt(3)
            averages.update(g2_at(step) * (1 + 0.5 * a), 50.0 * (1 + 0.3 * b), step - last, step)
            last = step
            growth.observe(step, averages)
        if step in checkpoints:
            plain = averages.estimate()
            found[step] = plain, growth.apply(last, averages)
    return found


@pytest.mark.parametrize("gap", [20, 50])
def test_a_growing_b_simple_is_read_nearer_the_latest_step(gap):
    """B_simple = 50·√t (|G|² ∝ 1/√t, 7.7× over 3,000 steps), one step in ``gap`` measured
    after a dense start: the averages read it late (they sit hundreds of steps back); the
    corrected value reads nearer on median and never overshoots by half, its 95% interval
    covers the truth at 80% of checkpoints or more (the averages' own at fewer), and the
    correction is said in words."""
    checkpoints = (1000, 1500, 2000, 3000)
    plain_ratios, ratios, covered, plain_covered = [], [], 0, 0
    for seed in range(4):
        found = run(lambda t: 1 / math.sqrt(t), 3000, gap, seed, checkpoints)
        for step, (plain, (corrected, growth)) in found.items():
            truth = 50 * math.sqrt(step)
            plain_ratios.append(plain.b_simple / truth)
            ratios.append(corrected.b_simple / truth)
            covered += corrected.ci_low <= truth <= corrected.ci_high
            plain_covered += plain.ci_low <= truth <= plain.ci_high
            assert growth is not None and growth.exponent > 0
            assert "growing" in describe_growth(growth)
    assert np.median(plain_ratios) < 0.9
    assert np.median(ratios) >= np.median(plain_ratios) + 0.08
    assert max(ratios) < 1.5
    assert covered >= 0.8 * len(ratios) and covered > plain_covered


def test_a_b_simple_that_holds_still_is_left_where_it_is():
    """Stationary (B_simple 50), one step in 20 measured: the correction moves the estimate by
    under 3% on median over seeds and never past its standard error."""
    moves = []
    for seed in range(6):
        found = run(lambda t: 1.0, 3000, 20, seed, (3000,))
        plain, (corrected, _) = found[3000]
        moves.append(abs(corrected.b_simple / plain.b_simple - 1))
        assert abs(corrected.b_simple - plain.b_simple) <= plain.stderr
        assert corrected.ci_low <= plain.ci_low and corrected.ci_high >= plain.ci_high
    assert np.median(moves) < 0.03


def test_no_correction_without_history_or_estimate():
    growth = GrowthCorrection()
    averages = DriftFollowingRatio(window=1000)
    estimate, applied = growth.apply(10, averages)
    assert applied is None and estimate.b_simple is None


def test_the_tracker_reads_forward_and_forgets_on_reset():
    """Records of a growing B_simple through the tracker: its reading is the corrected one
    (above the averages' own ratio); a reset (a new estimator) starts the history afresh."""
    tracker = Tracker(window=1000)
    rng = np.random.default_rng(1)
    for step in range(20, 3001, 20):
        g2 = 1 / math.sqrt(step) * (1 + 0.3 * rng.standard_normal())
        trace = 50.0 * (1 + 0.1 * rng.standard_normal())
        # per-example form: Y = |G|² + trΣ/N, Σ|c_i|² = N·(|G|² + trΣ)/N² for N = 64 examples
        n = 64
        total = g2 + trace / n
        sq_sum = (g2 + trace) / n
        values = [total, 1.0, sq_sum]
        record = StepRecord(step, "per_example", torch.tensor(values), n, ((n, 1.0, 1.0),), gap=20)
        assert tracker.add(record, values).used
    reading = tracker.reading("per_example", 1.0, False, False, None)
    plain = tracker.averages.estimate().b_simple
    assert tracker.growth_applied is not None
    assert reading.b_simple == pytest.approx(plain * tracker.growth_applied.factor)
    assert reading.b_simple > plain
    tracker.reset()
    assert tracker.growth.exponent() is None


def fed_tracker(steps: range, seed: int = 2) -> Tracker:
    """A tracker fed per-example records of a stationary B_simple (tr Σ 50, |G|² 1) at
    ``steps``."""
    tracker = Tracker(window=1000)
    rng = np.random.default_rng(seed)
    n = 64
    for step in steps:
        g2 = 1.0 * (1 + 0.3 * rng.standard_normal())
        trace = 50.0 * (1 + 0.1 * rng.standard_normal())
        values = [g2 + trace / n, 1.0, (g2 + trace) / n]
        assert tracker.add(
            StepRecord(step, "per_example", torch.tensor(values), n, ((n, 1.0, 1.0),)), values
        ).used
    return tracker


def test_a_reading_aged_past_its_last_measured_step_widens_with_the_steps_since():
    """A warm-up's allowance spent at once: 40 steps measured, then none. Read at step 40 the
    estimate is as it was; read at step 320 (the job's step) it is carried there, and its
    interval holds the fresh one and is wider on both sides. Before, it was read as of step
    40 whatever the job's step (the tracking benchmark's transformer: [57, 97] at step 384
    against an exact 523)."""
    tracker = fed_tracker(range(1, 41))
    fresh = tracker.reading("per_example", 1.0, False, False, "", now=40)
    aged = tracker.reading("per_example", 1.0, False, False, "", now=320)
    assert fresh.ci_low is not None and fresh.ci_high is not None
    assert aged.ci_low is not None and aged.ci_high is not None
    assert aged.ci_low < 0.7 * fresh.ci_low and aged.ci_high > 1.4 * fresh.ci_high
    assert tracker.reading("per_example", 1.0, False, False, "").ci_high == fresh.ci_high


def test_before_a_trend_is_known_an_aged_interval_spans_any_exponent_and_says_so():
    """With no exponent yet, a reading 8× past the step its averages stand for widens the
    interval to B·8^-1 … B·8^1.5 (``EXPONENT_RANGE``); the point stays; the tracker's detail
    says where the averages stand and why the interval is wide."""
    from bsmon.probes.noise.growth import stale
    from bsmon.probes.noise.smoothing import Estimate

    est = Estimate(b_simple=50.0, stderr=5.0, ci_low=40.0, ci_high=62.0)
    aged = stale(est, step=320, measured=40, stands_for=40)
    assert aged.b_simple == 50.0 and aged.stderr == 5.0
    assert aged.ci_low == pytest.approx(40.0 / 8) and aged.ci_high == pytest.approx(62.0 * 8**1.5)
    assert stale(est, step=40, measured=40, stands_for=40) == est
    # averages that stand for step 20, measured last at step 40: upwards from 20, down from 40
    behind = stale(est, step=320, measured=40, stands_for=20)
    assert behind.ci_high == pytest.approx(62.0 * 16**1.5)
    assert behind.ci_low == pytest.approx(40.0 / 8)
    tracker = fed_tracker(range(1, 41))
    tracker.growth.reset()  # no history: no trend
    aged_reading = tracker.reading("per_example", 1.0, False, False, "", now=320)
    assert "measured last at step 40" in (aged_reading.detail or "")
    assert "the averages stand for about step" in (aged_reading.detail or "")


def test_a_burst_of_early_steps_does_not_pass_for_the_latest_step():
    """The tracking benchmark's transformer: the warm-up's first 40 measured steps, taken
    while |G|² fell 30×, outweigh every later one, so the averages' effective step stayed at
    11–12 from step 48 to 192 while steps went on being measured, and never moved far enough
    for an exponent. Read at step 192, the interval widens upwards from step 11, not from the
    latest measured step (188): before, it read [76, 159] against an exact 430. Downwards it
    widens from the latest measured step, as before."""
    from bsmon.probes.noise.growth import EXPONENT_RANGE, MAX_LAG

    averages, growth = _Averages(), GrowthCorrection()
    averages.effective = 11.0
    for measured in range(40, 189, 10):
        growth.observe(measured, averages)
    assert growth.exponent() is None
    read, applied = growth.apply(192, averages, measured=188)
    bottom, top = EXPONENT_RANGE
    behind = min(192 / 11, math.exp(MAX_LAG))  # the interval's reach is capped at 16×
    assert applied is None and read.b_simple == 50.0
    assert read.ci_high == pytest.approx(55.0 * behind**top)
    assert read.ci_low == pytest.approx(45.0 * (192 / 188) ** bottom)


def test_a_steadily_measured_reading_barely_ages_between_measured_steps():
    """Measured one step in 20 for 3,000 steps: read 19 steps after the latest measured one,
    the interval moves by under 2% at either end."""
    tracker = fed_tracker(range(20, 3001, 20))
    latest = tracker.reading("per_example", 1.0, False, False, "", now=3000)
    later = tracker.reading("per_example", 1.0, False, False, "", now=3019)
    assert later.ci_low == pytest.approx(latest.ci_low, rel=0.02)
    assert later.ci_high == pytest.approx(latest.ci_high, rel=0.02)


class _Averages:
    """Averages whose ratio holds still at 50 (±5%) while their effective step is set."""

    def __init__(self) -> None:
        self.effective = 1.0

    @property
    def mean_age(self) -> float:
        return 0.0

    @property
    def log_step(self) -> float:
        return math.log(self.effective)

    def estimate(self):
        from bsmon.probes.noise.smoothing import Estimate

        return Estimate(b_simple=50.0, stderr=2.5, ci_low=45.0, ci_high=55.0, steps=40)


def test_a_trend_seen_over_a_short_stretch_is_not_carried_over_a_long_one():
    """The averages held still while their effective step went 20 → 40 (a warm-up's burst),
    then nothing was measured: read at step 640, 16× their effective step, the exponent
    measured over a doubling speaks for one doubling; upwards, the other eight-fold takes any
    exponent training could give, so the interval reaches 55·8^1.5; downwards it keeps p's
    range. Before, it reached ×1.7 upwards (the burst's 'holding still' carried 16× forward).
    Read within the measured stretch, it is as before."""
    from bsmon.probes.noise.growth import EXPONENT_RANGE

    averages, growth = _Averages(), GrowthCorrection()
    for effective in range(20, 41):
        averages.effective = float(effective)
        growth.observe(effective, averages)
    p, se, span = growth.exponent()
    assert abs(p) < 0.01 and span == pytest.approx(math.log(2.0))
    far, _ = growth.apply(640, averages, measured=40)
    bottom, top = EXPONENT_RANGE
    assert far.b_simple == pytest.approx(50.0)
    slowest = max(p - 1.959963984540054 * se, bottom)
    assert far.ci_high >= 55.0 * 8**top
    assert far.ci_low == pytest.approx(45.0 * 16 ** min(0.0, slowest))
    near, _ = growth.apply(60, averages, measured=40)  # 1.5× the effective step: within
    fastest = p + 1.959963984540054 * se
    assert near.ci_high == pytest.approx(55.0 * 1.5**fastest)
