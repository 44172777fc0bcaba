"""The measured signal in the one answer: a change's progress per example, measured from the
job's loss, moves the noise scale the advisor steers by (growth past what B_simple allows,
and undoing growth that does not pay), and each surface shows the measurement.

The simulated job's loss follows ``3 − 0.25·ln w`` plus a little seeded noise, ``w`` the
examples it has made worth one at its start size: each example at a size counts ``worth``."""

from __future__ import annotations

import math
import random

from bsmon.probes.batch.autopilot_trial import SPACING

from ..simulated_job import Job, tight


class Curve:
    """The job's loss: each window's examples counted at ``worth[size]`` (1 when unnamed)."""

    def __init__(
        self, job: Job, worth: dict[int, float], seed: int = 0, noise: float = 0.002
    ) -> None:
        self.job, self.worth, self.rng, self.noise = job, worth, random.Random(seed), noise
        self.made = 0.0
        self.seen = 0

    def __call__(self, _step: int) -> float:
        job = self.job
        window = (job.samples - self.seen) * self.worth.get(job.control.size, 1.0)
        self.made += window
        self.seen = job.samples
        middle = self.made - window / 2  # a window's mean loss: about its middle's
        return 3.0 - 0.25 * math.log(middle) + self.rng.gauss(0, self.noise)


def progress_events(job: Job) -> list:
    return [e for e in job.events if e.kind == "batch_size_progress"]


def test_growth_the_loss_shows_paying_goes_past_what_b_simple_allows():
    """B_simple 40 at B½ = 256 holds 128 (256 predicts 0.85×); the change 64 → 128 kept pace
    per example, so the loss's noise scale is far above 40 and 256 pays."""
    job = Job(size=64, half=256, noise=tight(40.0, spread=0.05), on=False)
    curve = Curve(job, {})
    job.run(60, loss=curve)
    job.control.request(128, confirm=True, reason="a key", source="monitor")
    job.run(40, loss=curve)
    (event,) = progress_events(job)
    change = job.control.watch.latest
    assert change.efficiency is not None and change.efficiency_low > 0.8
    assert event.message.startswith("batch 64 → 128 made ")
    assert event.data["predicted"] == (40 + 64) / (40 + 128)
    advice = job.advice
    assert advice.action == "raise" and advice.batch_size == 256
    assert "on the noise scale the loss measured" in advice.reasons[0]
    assert any(r.startswith("measured: batch 64 → 128 made") for r in advice.reasons)


def test_with_b_simple_alone_the_same_job_holds():
    """The control: no measured change (the start size all along), B_simple's hold stands."""
    job = Job(size=128, half=256, noise=tight(40.0, spread=0.05), on=False)
    job.run(100, loss=Curve(job, {}))
    assert job.advice.action == "stay"
    assert not any(r.startswith("measured:") for r in job.advice.reasons)


def test_growth_the_loss_shows_losing_is_undone():
    """B_simple 1,000 says 128 pays; the loss shows an example at 128 worth 0.3 of one at 64:
    the advisor says back down, on the measured noise scale."""
    job = Job(size=64, half=256, noise=tight(1000.0, spread=0.05), on=False)
    curve = Curve(job, {128: 0.3})
    job.run(60, loss=curve)
    job.control.request(128, confirm=True, reason="a key", source="monitor")
    job.run(40, loss=curve)
    change = job.control.watch.latest
    assert change.efficiency_high < 0.5
    advice = job.advice
    assert advice.action == "lower" and advice.batch_size == 64
    assert "on the noise scale the loss measured" in advice.reasons[0]


def test_a_change_with_too_little_before_it_is_not_measured_and_says_why():
    job = Job(size=64, half=256, noise=tight(40.0, spread=0.05), on=False)
    curve = Curve(job, {})
    job.run(3, loss=curve)
    job.control.request(128, confirm=True, reason="a key", source="monitor")
    job.run(40, loss=curve)
    assert not progress_events(job) and job.control.watch.latest.efficiency is None
    assert any(
        r == "measured: batch 64 → 128: 2 loss windows at the old size, 8 needed"
        for r in job.advice.reasons
    )


def trial_job(worth: dict[int, float], noise: float = 0.002) -> Job:
    """The autopilot on at 64 with B½ = 256 and B_simple 32: 128 predicts 0.99× the progress
    per second of 64, so B_simple holds 64 (a change needs 1.05×), within a trial's reach."""
    job = Job(size=64, half=256, declared_half=256, noise=tight(32.0, spread=0.05))
    job.curve = Curve(job, worth, noise=noise)
    return job


def run_until(job: Job, done, windows: int = 400) -> None:
    for _ in range(windows):
        if done():
            return
        job.run(1, loss=job.curve)
    raise AssertionError(f"not done in {windows} windows: {job.autopilot.waiting}")


def test_where_b_simple_holds_just_short_it_tries_the_next_size_and_keeps_it_if_it_pays():
    job = trial_job({})
    run_until(job, job.decisions)
    (trial,) = job.decisions()
    assert (trial.old, trial.new, trial.kind) == (64, 128, "grow")
    assert trial.predicted_gain < 1.05
    assert trial.note == (
        f"trial: B_simple predicts {trial.predicted_gain:.2f}×; 128 is kept only if the loss "
        "shows it paying against 64's own curve"
    )
    base = len(job.control.watch.progress.stretch)
    assert base >= 20  # the loss windows at 64, its base
    run_until(job, lambda: any("trial of 128" in e.message for e in job.events))
    said = next(e.message for e in job.events if "trial of 128" in e.message)
    assert said.startswith("autopilot: trial of 128: 128 pays: the loss measured ")
    assert job.control.size == 128 and job.autopilot.state == "on"
    job.run(40, loss=job.curve)
    assert job.control.size >= 128  # kept: the loss's floor lets it hold, or go on


def test_a_trial_the_loss_shows_losing_goes_back_and_waits_before_the_next():
    job = trial_job({128: 0.5})  # an example at 128 worth half of one at 64: no faster at all
    run_until(job, job.decisions)
    tried_at = job.samples
    run_until(job, lambda: len(job.decisions()) >= 2)
    trial, back = job.decisions()
    assert (trial.new, back.old, back.new, back.kind) == (128, 128, 64, "shrink")
    assert back.note.startswith("trial of 128: 128 does not pay: the loss measured 0.")
    assert "of 64's progress per example, ≤ 0." in back.note
    run_until(job, lambda: len(job.decisions()) >= 3)  # the next trial waits: examples ×2
    assert job.decisions()[2].new == 128 and job.samples >= SPACING * tried_at


def test_no_trial_while_the_loss_is_too_noisy_to_tell():
    """A window's loss wandering by 0.05 (one step's loss, read once a tick on a fast loop)
    could not tell 128 paying from not until 64 has run long enough: B_simple's hold stands
    meanwhile (a clear loss tries 128 at step 230)."""
    job = trial_job({}, noise=0.05)
    job.run(100, loss=job.curve)
    assert job.decisions() == [] and job.control.size == 64
    assert job.autopilot.advisor.hold.rule == "threshold"
    run_until(job, job.decisions)
    assert job.decisions()[0].step > 1000
