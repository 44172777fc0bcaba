"""The advisor: one answer to "which batch size?", driven window by window on a simulated job
(the autopilot off: the advisor answers all the same) whose step time follows t(B) = c(B½ + B)."""

from __future__ import annotations

import msgspec
import pytest

from bsmon.probes.batch.autopilot_holds import THRESHOLD
from bsmon.probes.batch.footprint import Footprint
from bsmon.probes.batch.goodput import break_even, goodput_gain
from bsmon.probes.batch.regather import ASSUMED_BANDWIDTH, RegatherCost
from bsmon.probes.wire.describe import describe_advice
from bsmon.probes.wire.protocol import NoiseScaleReading

from ..simulated_job import Job, tight


def advice_events(job: Job) -> list:
    return [e for e in job.events if e.kind == "advice"]


def test_it_raises_one_change_at_a_time_toward_its_target_and_waits_for_each_to_train_well():
    """The demo's finding (issue 41): from 128 the probe recommended 262, 2.05× the last size
    that trained well, where `+` would have asked first. One change goes at most 2× from
    that size, and the next waits until this one has trained well."""
    job = Job(size=128, half=10_000, noise=tight(262.0, spread=0.05), on=False)
    job.autopilot.advisor.learn_probe([(b, job.step_time(b)) for b in (128, 1024, 4096)])
    job.run(60)
    advice = job.advice
    assert advice.action == "raise" and advice.batch_size == 256 and advice.current == 128
    assert advice.reasons[0].startswith("goodput: 256 predicts")
    assert (
        advice.target > 256
        and f"toward {advice.target:,}, one change at a time" in (advice.reasons[0])
    )
    assert advice.headline == "raise → 256" and advice.gain > THRESHOLD
    assert any(r.startswith("noise scale: B_simple ≈ 262") for r in advice.reasons[1:])
    job.control.request(256, confirm=False, reason="the advice", source="monitor")
    job.run(5)  # 256 runs, but has not trained well: 512 is 4× the 128 that last did
    assert job.control.size == 256 and job.control.watch.trained_well == 128
    assert job.advice.action == "stay" and job.advice.rule == "trained"
    assert job.advice.why == "2× from 128"
    assert "512 is 4× the last batch size that trained well (128)" in job.advice.reasons[0]
    job.run(30)  # 300 steps at 256 with the loss flat: it trained well; the next change
    assert job.control.watch.trained_well == 256
    assert job.advice.action == "raise" and job.advice.batch_size == 512


def test_it_never_advises_a_size_that_may_not_fit():
    job = Job(size=128, half=10_000, noise=tight(5000.0, spread=0.05), on=False)
    job.control.probe_max = 200
    job.run(40)
    assert job.advice.action == "stay" and job.advice.rule == "fit"
    assert job.advice.why == "256 may not fit"
    assert "memory: up to 200 (the probe)" in job.advice.reasons


def test_it_waits_while_the_noise_scale_is_unresolved_and_says_for_what():
    job = Job(noise=lambda _s: NoiseScaleReading(needed=30, effective=12.0), on=False).run(20)
    advice = job.advice
    assert advice.action == "wait" and advice.batch_size == advice.current == 16
    assert advice.reasons[0] == "waiting for B_simple to resolve (12 of 30 effective steps)"
    assert advice.confidence == "low" and advice.headline == "stay at 16"
    assert advice.would_change == "B_simple to resolve (12 of 30 effective steps)"


def test_after_a_divergence_it_says_back_at_once_and_stops_when_the_loss_recovers():
    job = Job(size=64, half=64, noise=tight(100.0, spread=0.05), on=False).run(30)
    job.control.request(128, confirm=True, reason="a key", source="monitor")
    change_step = job.step
    job.run(8, loss=lambda s: 3.0 if s > change_step + 10 else 1.0)
    advice = job.advice
    assert job.control.watch.latest.loss == "diverged"
    assert advice.action == "back" and advice.batch_size == 64 and advice.confidence == "high"
    assert advice.reasons[0].startswith("the loss diverged after batch 64 → 128 at step")
    assert advice_events(job)[-1].data["advice"]["action"] == "back"  # said at once
    job.run(10)  # the loss comes back at 128
    assert job.control.watch.latest.loss == "recovered"
    assert job.advice.action != "back"
    assert job.autopilot.advisor.out_of_reach == 128  # 128 and above stay out of reach


def test_what_would_change_it_is_the_noise_scale_at_which_the_decision_flips():
    job = Job(size=64, half=256, noise=tight(2000.0, spread=0.05), on=False).run(40)
    advice = job.advice
    assert advice.action == "raise" and advice.batch_size == 128
    half = job.autopilot.advisor.model.half_batch  # one size measured: B½ taken as 64
    edge = break_even(128, 64, half, THRESHOLD)
    assert goodput_gain(128, 64, phi=edge, half=half) == pytest.approx(THRESHOLD)
    assert advice.would_change.startswith(f"B_simple below ≈ {edge:,.0f} (B_simple ≈ 2k now)")
    low = Job(size=64, half=256, noise=tight(edge * 0.8, spread=0.05), on=False).run(40)
    assert low.advice.action == "stay" and low.advice.rule == "threshold"
    assert "B_simple above ≈" in low.advice.would_change


def test_the_probes_step_times_give_the_shape_while_the_job_has_run_one_size():
    job = Job(size=64, half=256, noise=tight(2000.0, spread=0.05), on=False).run(20)
    assert "assumed" in job.autopilot.advisor.model.how and job.advice.confidence == "low"
    advisor = job.autopilot.advisor
    advisor.learn_probe([(b, job.step_time(b) * 1.7) for b in (64, 512, 2048)])  # a slower sidecar
    advice = advisor.advise()
    assert "from the probe's step times" in advisor.model.how
    assert advisor.model.half_batch == pytest.approx(256)
    assert advice.confidence == "medium"  # the sidecar ran beside the job: not the job's own
    assert advice.step == job.advice.step


def test_it_says_each_new_answer_once_and_its_final_word_at_the_end():
    job = Job(size=64, half=64, noise=tight(100.0, spread=0.05), on=False).run(60)
    said = advice_events(job)  # the same answer every window is said once, once it settles
    assert [e.data["advice"]["action"] for e in said] == ["stay"]  # "measuring" did not
    assert said[-1].message == describe_advice(job.advice)
    job.advisor_extension.last_word()
    final = advice_events(job)[-1]
    assert final.data["final"] and final.message.startswith("final word: ")
    assert final.data["advice"]["batch_size"] == job.advice.batch_size


def test_the_autopilot_acts_on_the_advice_and_a_hold_names_the_advisors_rule():
    job = Job(size=16, half=64, noise=tight(1000.0, spread=0.05)).run(6)
    (grow,) = job.decisions("grow")
    assert grow.new == 32 and job.advice.current == 32  # the advice was raise → 32
    said = [e.data["advice"] for e in advice_events(job)]
    assert said[0]["action"] == "raise" and said[0]["batch_size"] == 32
    job.run(4)
    assert job.autopilot.reading().held == "holds: 2× from 16" == f"holds: {job.advice.why}"


def test_an_answer_that_flips_at_the_threshold_window_by_window_is_not_said_each_time():
    """Seen in the demo (issue 41): at 1.045–1.05× the advice went back and forth between
    "raise → 128" and "stay at 64" each window, each flip an event. An answer is said once it
    has held three windows."""
    either_side = {0: tight(2000.0, spread=0.05), 1: tight(120.0, spread=0.05)}
    job = Job(size=64, half=256, noise=lambda step: either_side[step // 10 % 2](step), on=False)
    answers = set()
    for _ in range(40):
        job.run(1)
        answers.add(job.advice.action)
    assert {"raise", "stay"} <= answers  # it flipped every window ...
    assert advice_events(job) == []  # ... and none was news


def test_on_several_ranks_it_weighs_each_ranks_batch_against_its_share_of_b_simple():
    """B_simple counts the examples of a whole step, every rank's: at 128 on each of 2 ranks
    and B_simple 262, a step of 256 examples is already near it. Read against one rank's 128
    it said "raise → 256" (the case above), twice too far."""
    noise = tight(262.0, spread=0.05)

    def two_ranks(step: int) -> NoiseScaleReading:
        return msgspec.structs.replace(noise(step), ranks=2)

    alone = Job(size=128, half=10_000, noise=noise, on=False)
    ranked = Job(size=128, half=10_000, noise=two_ranks, on=False)
    for job in (alone, ranked):
        job.autopilot.advisor.learn_probe([(b, job.step_time(b)) for b in (128, 1024, 4096)])
        job.run(60)
    assert alone.advice.action == "raise" and alone.advice.target > 256
    assert ranked.advice.target < alone.advice.target
    fact = next(r for r in ranked.advice.reasons if r.startswith("noise scale"))
    assert "B_simple ≈ 262" in fact and "a step at 256 (128 on each of 2 ranks)" in fact


def sharded_job(regather_s: float) -> Job:
    """Micro-batches of 32, two per step (64), sharded over 2 ranks: each micro-batch more
    gathers again the bytes that take ``regather_s`` at the CPU's assumed bandwidth (half of
    them come from the other rank)."""
    gathered = round(2 * regather_s * ASSUMED_BANDWIDTH["cpu"])
    footprint = Footprint(1, 1, 1, gathered=1, per_micro_batch=gathered, shards=2)
    regather = RegatherCost(
        lambda: footprint, micro_batch=lambda: 32, world_size=2, device_type="cpu"
    )
    return Job(size=64, micro_batch_size=32, half=10_000, noise=NOISE, regather=regather)


NOISE = tight(5000.0, spread=0.05)
PRICE = "2 more micro-batches of 32 per step, each gathering the sharded parameters again"


def test_a_sharded_job_growing_by_accumulation_pays_the_regather_and_says_so():
    """Growing 64 → 128 adds two micro-batches of 5 ms of re-gather each: the gain predicted
    is the unsharded job's with 10 ms more in the step, and the autopilot's event says so."""
    plain = Job(size=64, micro_batch_size=32, half=10_000, noise=NOISE).run(40)
    sharded = sharded_job(0.005).run(40)
    grew, grew_sharded = plain.decisions("grow")[0], sharded.decisions("grow")[0]
    assert (grew.old, grew.new) == (grew_sharded.old, grew_sharded.new) == (64, 128)
    t64 = plain.step_time(64)  # one size measured: half of it taken as fixed (B½ = 64)
    phi = 5000 * 0.95**0.5  # what growth reads: √(point · low)
    speed = (128 / (1.5 * t64 + 2 * 0.005)) / (64 / t64)
    predicted = speed * (phi + 64) / (phi + 128)
    assert grew_sharded.predicted_gain == pytest.approx(predicted, rel=1e-6)
    assert grew_sharded.predicted_gain < grew.predicted_gain
    assert PRICE in grew_sharded.note and not grew.note
    event = next(e for e in sharded.events if e.kind == "autopilot")
    assert PRICE in event.message and "+10.0 ms a step" in event.message
    assert f"assumed {ASSUMED_BANDWIDTH['cpu'] / 1e9:g} GB/s on cpu" in event.message


def test_a_regather_that_eats_the_gain_holds_the_size_and_says_its_price():
    """At 20 ms a micro-batch the 1.32× an unsharded job predicts falls to 1.04×: stay."""
    job = sharded_job(0.020).run(40)
    assert not job.decisions() and job.advice.action == "stay"
    assert job.advice.reasons[0].startswith("holding at 64: 128 predicted 1.04×")
    assert PRICE in job.advice.reasons[0] and "+40.0 ms a step" in job.advice.reasons[0]
    assert any("re-gathers the sharded parameters" in r for r in job.advice.reasons)
