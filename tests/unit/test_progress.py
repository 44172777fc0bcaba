"""The measured signal: a change's progress per example, from the loss against the old size's
own curve carried on, on loss curves whose truth is known (``L = 3 − q·ln e`` before the
change, ``3 − q·ln(e_c + E·(e − e_c))`` after, with seeded noise)."""

from __future__ import annotations

import math
import random

import pytest

from bsmon.probes.batch.progress import (
    MAX_WINDOWS,
    MIN_BASE,
    ProgressMeter,
    Window,
    append_window,
    fit_base,
    implied_noise_scale,
    measure,
)

WINDOW = 1_000  # examples per metrics window
CHANGE_AT = 40_000  # the job's examples at the change


def loss_at(examples: float, efficiency: float, q: float = 0.25) -> float:
    """The true curve: the old size's until the change, then ``efficiency`` of it per example."""
    if examples > CHANGE_AT:
        examples = CHANGE_AT + efficiency * (examples - CHANGE_AT)
    return 3.0 - q * math.log(examples)


def windows(
    start: float, stop: float, efficiency: float, *, seed: int, noise: float = 0.03, rho=0.0
) -> list[Window]:
    """Windows of ``WINDOW`` examples from ``start`` to ``stop``; the noise AR(1) with ``rho``
    (the same marginal spread)."""
    rng = random.Random(seed)
    out, wander = [], 0.0
    e = start
    while e + WINDOW <= stop:
        wander = rho * wander + math.sqrt(1 - rho**2) * rng.gauss(0, noise)
        middle = e + WINDOW / 2
        out.append(Window(middle, loss_at(middle, efficiency) + wander, WINDOW))
        e += WINDOW
    return out


def measured(efficiency: float, seed: int, *, after: float = 20_000, rho: float = 0.0, noise=0.03):
    base, why = fit_base(windows(8_000, CHANGE_AT, efficiency, seed=seed, rho=rho, noise=noise))
    assert base is not None, why
    later = windows(
        CHANGE_AT, CHANGE_AT + after, efficiency, seed=seed + 1000, rho=rho, noise=noise
    )
    return measure(base, later, (64, 128, 500, CHANGE_AT))


def test_the_noise_scale_it_implies_inverts_the_efficiency():
    for phi in (10.0, 64.0, 300.0):
        efficiency = (phi + 64) / (phi + 128)
        assert implied_noise_scale(efficiency, 64, 128) == pytest.approx(phi)
    assert implied_noise_scale(1.0, 64, 128) == math.inf  # kept pace: no bound above
    assert implied_noise_scale(0.4, 64, 128) == 0.0  # below 64/128: no bound below
    assert implied_noise_scale((100 + 128) / (100 + 64), 128, 64) == pytest.approx(100.0)
    assert implied_noise_scale(0.9, 128, 64) == math.inf  # a change down that lost nothing
    assert implied_noise_scale(2.5, 128, 64) == 0.0


def test_a_short_or_flat_loss_is_no_base_and_says_why():
    short = windows(8_000, 8_000 + (MIN_BASE - 1) * WINDOW, 1.0, seed=1)
    assert fit_base(short) == (None, f"{MIN_BASE - 1} loss windows at the old size, 8 needed")
    flat = [
        Window(w.examples, 2.0 + (w.loss - loss_at(w.examples, 1.0)), WINDOW)
        for w in windows(8_000, CHANGE_AT, 1.0, seed=2)
    ]
    assert fit_base(flat) == (None, "the loss at the old size was not measurably falling")


@pytest.mark.parametrize("truth", [1.0, 0.6, 0.3])
def test_it_finds_a_changes_worth_per_example_within_its_interval(truth):
    inside = 0
    for seed in range(20):
        found = measured(truth, seed)
        assert found is not None and found.final
        inside += found.low <= truth <= found.high
        assert found.low < found.efficiency < found.high
    assert inside >= 18  # Z = 2.5 standard errors each way: ~99% in theory


def test_a_changes_worth_is_told_apart_from_another_when_the_loss_is_clear():
    """Where a window's loss is clear (a language model's, averaged over many tokens), a
    change that kept pace is told from one that made 0.3× of it: the implied noise scales do
    not overlap. At 0.03 a window (1,000 examples of a per-example spread of 1), they do."""
    kept, lost = measured(1.0, 3, noise=0.01), measured(0.3, 3, noise=0.01)
    assert kept.low > lost.high
    assert kept.bounds()[0] > lost.bounds()[1]


def test_a_wandering_loss_widens_the_interval():
    """Neighbouring windows of an SGD iterate's loss are not independent: the interval says
    so (the same marginal noise, correlated, gives a wider interval)."""
    spread = [
        sum(math.log(m.high / m.low) for m in (measured(1.0, s, rho=rho) for s in range(10)))
        for rho in (0.0, 0.8)
    ]
    assert spread[1] > 1.5 * spread[0]


def test_more_examples_after_the_change_narrow_the_interval():
    short, long = measured(0.6, 4, after=6_000), measured(0.6, 4, after=20_000)
    assert not short.final and long.final
    assert math.log(long.high / long.low) < math.log(short.high / short.low)


def feed(
    meter: ProgressMeter, stop: float, efficiency: float, size: int, seed: int, noise=0.01
) -> list:
    """Windows of 10 steps at ``size`` until the job's examples reach ``stop``, each example
    worth ``efficiency`` of one at the start size (``feed.worth``: the start size's examples
    so far, whose curve the loss follows); the step and examples carry on. Returns each
    window's ``observe``."""
    rng = random.Random(seed)
    said = []
    while feed.samples + 10 * size <= stop:
        feed.step += 10
        feed.samples += 10 * size
        middle = feed.worth + 5 * size * efficiency
        feed.worth += 10 * size * efficiency
        spread = noise * math.sqrt(WINDOW / (10 * size))
        said.append(
            meter.observe(feed.step, 10, feed.samples, loss_at(middle, 1.0) + rng.gauss(0, spread))
        )
    return said


def test_the_meter_measures_the_latest_change_once_and_keeps_the_floor_it_showed():
    feed.step, feed.samples, feed.worth = 0, 0, 0.0
    # seeded: the first change's interval covers the truth in 59 of 60 seeds (its base fitted
    # over its last 16× of examples), and the floor and ceiling asserted below follow from
    # where each interval fell; seeds 1 and 2 made the one miss once the base became recent
    meter = ProgressMeter()
    feed(meter, CHANGE_AT, 1.0, 64, seed=21)
    meter.change(64, 128, feed.step, phi=40.0)  # B_simple 40 predicts 104/168 = 0.62
    said = feed(meter, 2.2 * CHANGE_AT, 1.0, 128, seed=22)
    assert said.count(True) == 1  # final once
    latest = meter.latest
    assert latest.final and latest.low < 1.0 < latest.high
    assert latest.predicted == pytest.approx(104 / 168)
    assert meter.floor == latest.bounds()[0] > 40  # the loss showed it above B_simple's 40
    assert meter.ceiling == math.inf  # kept pace: no bound above
    said = latest.text()
    assert said.startswith(f"batch 64 → 128 made {latest.efficiency:.2f}× [{latest.low:.2f}, ")
    assert "B_simple predicted 0.62×; the loss's noise scale: ≥ " in said
    floor = meter.floor
    meter.change(128, 256, feed.step, phi=None)  # a change whose base is long: measured
    feed(meter, 3.3 * CHANGE_AT, 0.6, 256, seed=3)  # 0.6 of 128's: φ = 64 by the model
    assert meter.latest.final and meter.latest.low < 0.6 < meter.latest.high < 0.9
    low, high = meter.latest.bounds()
    assert low < 64 < high < floor and meter.floor == low  # newer evidence below the floor
    assert meter.ceiling == high
    meter.change(256, 128, feed.step, phi=None)  # the change back: the ceiling outlives it
    feed(meter, feed.samples + 4 * 10 * 128, 1.0, 128, seed=4)
    assert meter.latest is None and meter.ceiling == high


def test_an_upper_end_goes_stale_once_the_jobs_examples_doubled():
    feed.step, feed.samples, feed.worth = 0, 0, 0.0
    meter = ProgressMeter()
    feed(meter, CHANGE_AT, 1.0, 64, seed=1)
    meter.change(64, 128, feed.step, phi=None)
    said = feed(meter, 2 * CHANGE_AT, 0.6, 128, seed=2)
    reading = feed.samples - 10 * 128 * (len(said) - said.index(True) - 1)  # the final one's
    high = meter.ceiling
    assert math.isfinite(high)
    feed(meter, 2 * reading, 0.6, 128, seed=3)
    assert meter.ceiling == high
    feed(meter, 2 * reading + 10 * 128, 0.6, 128, seed=4)
    assert meter.ceiling == math.inf


def test_a_window_with_steps_at_both_sizes_is_neither_sizes():
    meter = ProgressMeter()
    meter.observe(10, 10, 640, 2.0)
    meter.change(64, 128, 15, phi=None)
    assert meter.why == "batch 64 → 128: 0 loss windows at the old size, 8 needed"
    assert meter.observe(20, 10, 640 + 5 * 64 + 5 * 128, 1.9) is False
    assert meter.stretch == []  # the straddling window counted for neither size
    meter.observe(30, 10, 640 + 5 * 64 + 15 * 128, 1.8)
    assert len(meter.stretch) == 1


def test_a_stretch_of_hours_is_kept_in_at_most_max_windows_and_fits_the_same():
    many = windows(8_000, 8_000 + 3 * MAX_WINDOWS * 100, 1.0, seed=6)
    kept: list = []
    for window in many:
        append_window(kept, window)
    assert len(kept) <= MAX_WINDOWS
    assert sum(w.weight for w in kept) == sum(w.weight for w in many)
    whole, merged = fit_base(many)[0], fit_base(kept)[0]
    assert merged.q == pytest.approx(whole.q, rel=0.02)


def test_a_base_is_fitted_over_its_recent_stretch_where_a_long_curve_bends():
    """A loss bending toward its floor (``1 + 8·e^-0.3``) over 4,000 windows: a line through
    all of them runs steeper than the stretch's end, and carried on it would put the loss far
    below where the curve goes; the recent stretch's line stays near it. A wild window from
    before that stretch changes nothing."""

    def bending(e: float) -> float:
        return 1.0 + 8.0 * e**-0.3

    stretch = [Window(e, bending(e), WINDOW) for e in range(500, 4_000_000, WINDOW)]
    recent, whole = fit_base(stretch)[0], fit_base(stretch, span=math.inf)[0]
    later = 2 * stretch[-1].examples
    assert abs(recent.at(later) - bending(later)) < 0.5 * abs(whole.at(later) - bending(later))
    wild = [Window(100.0, 50.0, WINDOW), *stretch]
    assert fit_base(wild)[0] == recent


def test_a_loss_too_scattered_to_measure_gives_an_open_interval_not_an_overflow():
    """The demo, switched on after 24k steps at 64: a change measured against a nearly flat
    base, the loss after it far above the curve. E sits at the grid's floor and its interval's
    upper end is past a float (math.exp raised in the agent's tick before)."""
    from bsmon.probes.batch.progress import BaseLine

    flat = BaseLine(
        p=1.0,
        q=-1e-4,
        variance=50.0,
        weight=8_000.0,
        mean_x=math.log(4_000.0),
        sxx=0.5,
        first=1_000.0,
        last=8_000.0,
        windows=8,
    )
    after = [Window(8_000.0 + 500 * (k + 0.5), 3.0, 500.0) for k in range(MIN_BASE)]
    reading = measure(flat, after, (64, 128, 100, 8_000.0))
    assert reading.efficiency == pytest.approx(1 / 32)
    assert reading.high == math.inf and reading.low >= 0.0
    said = reading.text()
    assert "[0.00, ∞] of 64's progress per example" in said
    assert "too wide to tell (the loss at 128 scatters about the curve)" in said
