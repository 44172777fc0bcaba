"""The autopilot's claim, measured from the loss where it can be: the seconds a fixed start
size would take, by its own curve at its measured throughput, to the loss the run reached,
over the seconds the run took. A ledger fed metrics windows of a run whose loss follows
``3 − slope·ln w`` (``w``: the examples made, each at 32 worth ``worth`` of one at 16)."""

from __future__ import annotations

import math
import random

import pytest

from bsmon.probes.batch.gain_claim import GainLedger
from bsmon.probes.batch.progress import ProgressMeter
from bsmon.probes.wire.protocol import Metrics, NoiseScaleReading

STEP_S = {16: 1.0e-3, 32: 1.25e-3}  # 32 runs 1.6× the examples a second of 16
TRACKING = NoiseScaleReading(phase="tracking")


class Run:
    def __init__(self, switched_on: bool = True, noise: float = 0.001, slope: float = 0.25) -> None:
        self.ledger = GainLedger(16)
        self.meter = ProgressMeter()  # the batch watch's: the loss windows at the size now
        if switched_on:
            self.ledger.begin(16, step=0)
        self.step = self.samples = 0
        self.made = 0.0
        self.rng = random.Random(0)
        self.noise = noise
        self.slope = slope
        self.seconds = 0.0

    def windows(self, size: int, count: int, worth: float = 1.0) -> Run:
        for _ in range(count):
            window = 10 * size
            middle = self.made + worth * window / 2
            self.made += worth * window
            self.step += 10
            self.samples += window
            self.seconds += 10 * STEP_S[size]
            metrics = Metrics(
                t=float(self.step),
                step=self.step,
                batch_size=size,
                step_time_s=STEP_S[size],
                samples_per_s=size / STEP_S[size],
                b_simple=None,
                steps_in_window=10,
                samples=self.samples,
                scalars={"loss": self.loss(middle)},
                noise=TRACKING,
            )
            self.ledger.add(metrics, 1000.0)
            self.meter.observe(self.step, 10, self.samples, metrics.scalars["loss"])
        return self

    def loss(self, made: float) -> float:
        return 3.0 - self.slope * math.log(made) + self.rng.gauss(0, self.noise)

    def switch_on(self) -> Run:
        """The autopilot switched on now, as ``Autopilot.switch`` begins its span."""
        self.ledger.begin(16, self.step, self.meter.stretch)
        self.start = self.samples, self.seconds
        return self

    def grow(self) -> Run:
        self.ledger.decided()
        return self


def test_a_run_that_kept_pace_per_example_claims_the_speed_it_bought():
    run = Run().windows(16, 40).grow().windows(32, 30)
    claimed, how = run.ledger.claim()
    fixed_16 = run.samples / (16 / STEP_S[16])  # seconds a fixed 16 takes to the same loss
    assert claimed == pytest.approx(fixed_16 / run.seconds, rel=0.05)
    prefix = (
        "against a fixed batch of 16: the loss it reached, by the base's own curve at the "
        f"base's measured throughput ({claimed:.2f}× ["
    )
    assert how.startswith(prefix)
    low, high = map(float, how[len(prefix) : -2].split(", "))
    assert low < claimed < high < 1.25 * claimed


def test_a_run_that_lost_more_per_example_than_its_speed_bought_claims_a_loss():
    """Each example at 32 worth 0.3 of one at 16: the model's efficiency (B_simple 1,000)
    would claim a gain; the loss shows a loss."""
    run = Run().windows(16, 40).grow().windows(32, 30, worth=0.3)
    claimed, _how = run.ledger.claim()
    assert claimed < 1
    modelled = run.ledger._modelled_claim()[0]
    assert modelled > 1.2  # the model saw a gain


def test_a_base_too_short_to_measure_leaves_the_models_claim_saying_it_is_unsure():
    run = Run().windows(16, 3).grow().windows(32, 80)
    claimed, how = run.ledger.claim()
    assert claimed == run.ledger._modelled_claim()[0]
    assert how.endswith(
        "; unsure, not measured from the loss: batch 16's own curve: 3 loss windows at the "
        "base, 8 needed"
    )


def test_a_loss_beyond_where_the_base_was_measured_is_not_carried_there():
    run = Run().windows(16, 10).grow().windows(32, 200)
    claimed, how = run.ledger.claim()
    assert claimed == run.ledger._modelled_claim()[0]
    assert "the loss reached lies beyond batch 16's own curve (measured to 1.52k" in how


def test_switched_on_mid_run_the_windows_before_the_switch_on_are_the_bases_curve():
    """The demo's case: 64 for thousands of steps, then ``a``, then a change one window later:
    the base's curve is the run at 64 before it, not the one window after the switch-on."""
    run = Run(switched_on=False).windows(16, 40).switch_on().windows(16, 1).grow().windows(32, 30)
    claimed, how = run.ledger.claim()
    assert "the loss it reached, by the base's own curve at the base's measured throughput" in how
    samples, seconds = run.samples - run.start[0], run.seconds - run.start[1]
    fixed_16 = samples / (16 / STEP_S[16])  # seconds a fixed 16 takes from the switch-on
    assert claimed == pytest.approx(fixed_16 / seconds, rel=0.1)
    short = Run(switched_on=False).windows(16, 40)
    short.ledger.begin(16, short.step)  # no curve handed over: one window is no base
    short.windows(16, 1).grow().windows(32, 30)
    assert "unsure" in short.ledger.claim()[1]


def test_a_claim_whose_interval_is_wide_is_left_to_the_model_and_says_so():
    """A loss scattered as much as it falls over the base: the examples it would take a fixed
    16 to reach the loss now are known only to a factor of several, too loose to claim."""
    run = Run(noise=0.05).windows(16, 12).grow().windows(32, 12)
    claimed, how = run.ledger.claim()
    assert claimed == run.ledger._modelled_claim()[0]
    assert "unsure, not measured from the loss: batch 16's own curve carried to the loss " in how
    assert how.endswith(", too wide to claim")
