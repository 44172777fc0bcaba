"""The autopilot's decisions and guards, driven window by window on a simulated job: a real
BatchController and Autopilot, fed metrics windows whose step time follows t(B) = c(B½ + B)
and whose noise-scale reading the test chooses."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

from bsmon.probes.batch.autopilot import SETTLE_STEPS, WARMUP_STEPS
from bsmon.probes.batch.autopilot_holds import THRESHOLD
from bsmon.probes.batch.gain_claim import GainLedger
from bsmon.probes.batch.goodput import (
    fit_step_time,
    goodput_gain,
    optimum,
    throughput_ratio,
)
from bsmon.probes.batch.loss_watch import WATCH_STEPS
from bsmon.probes.batch.verdict import SizeThroughput
from bsmon.probes.runtime.inbox import TICK_S
from bsmon.probes.wire.protocol import (
    Event,
    Metrics,
    NoiseScaleReading,
)
from bsmon.probes.wire.routing import CommandRefused

from ..simulated_job import Job, Noise, tight

# -- the model ------------------------------------------------------------------------------


def test_the_optimum_maximises_goodput_and_the_ratios_are_consistent():
    for phi, half in [(1000, 64), (50, 16), (20000, 256)]:
        best = optimum(phi, half)
        grid = [best * f for f in (0.25, 0.5, 0.8, 1.25, 2, 4)]
        assert all(goodput_gain(b, best, phi=phi, half=half) < 1 for b in grid)
    assert throughput_ratio(64, 16, math.inf) == 4  # overhead-bound: throughput ∝ B
    assert throughput_ratio(64, 16, 0.0) == pytest.approx(1)  # saturated: no more throughput
    assert optimum(1000, math.inf) == math.inf


def sizes_measured(half: float, c: float, sizes: list[int]) -> dict[int, SizeThroughput]:
    measured = {}
    for size in sizes:
        throughput = SizeThroughput()
        for _ in range(3):
            throughput.add(size / (c * (half + size)) * 0.5, 0.5)
        measured[size] = throughput
    return measured


def test_the_step_time_line_is_recovered_from_measured_sizes():
    model = fit_step_time(sizes_measured(48.0, 2e-5, [16, 32, 64, 128]))
    assert model is not None and model.how == "fitted from 4 sizes"
    assert model.half_batch == pytest.approx(48.0)
    assert model.step_time(100) == pytest.approx(2e-5 * 148)
    one = fit_step_time(sizes_measured(48.0, 2e-5, [16]))
    assert one is not None and one.half_batch == pytest.approx(16) and "assumed" in one.how
    declared = fit_step_time(sizes_measured(48.0, 2e-5, [16, 64]), declared_half=256)
    assert declared is not None and declared.half_batch == pytest.approx(256)
    assert fit_step_time({}) is None


# -- decisions --------------------------------------------------------------------------------


def test_it_grows_at_most_2x_a_decision_to_near_the_optimum_and_holds_there():
    job = Job(size=16, half=64, noise=tight(1000.0, spread=0.05)).run(120)
    target = optimum(math.sqrt(1000 * 950), 64)  # growth's read, √(point · low end): ≈ 250
    assert job.control.size == 256, job.sizes
    for decision in job.decisions():
        assert decision.kind == "grow" and decision.new == 2 * decision.old
        assert decision.predicted_gain > THRESHOLD
    first = job.decisions()[0]
    assert first.step >= WARMUP_STEPS
    reading = job.autopilot.reading()
    assert reading.target == pytest.approx(target, abs=1)
    assert reading.half_batch == pytest.approx(64) and reading.half_batch_how.startswith("fitted")
    assert reading.waiting.startswith("holding at 256: ")
    assert "a change needs 1.05×" in reading.waiting
    # the learning rate followed the batch by the rule for SGD: linear
    assert job.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 256 / 16)
    steps = [d.step for d in job.decisions()]
    assert all(b - a >= SETTLE_STEPS for a, b in itertools.pairwise(steps))


def test_holding_on_a_loop_faster_than_its_looks_it_still_names_the_next_one():
    """Windows of 40 steps, more than the 25 between looks: every window is a look, and the
    panel shows the step of the next, not none and not a step gone by."""
    job = Job(size=16, half=64, noise=tight(1000.0, spread=0.05)).run(60, steps=40)
    reading = job.autopilot.reading()
    assert reading.waiting.startswith("holding at 256: ")
    assert reading.next_decision_step == job.step + SETTLE_STEPS


@pytest.mark.parametrize(("point", "low", "grows"), [(1200, 600, True), (1000, 400, False)])
def test_growth_reads_the_noise_scale_between_its_point_and_its_intervals_low_end(
    point, low, grows
):
    """At 128 with B½ = 64 a doubling pays 1.05× once φ ≥ 768: √(1200·600) = 849 grows where
    the low end alone (600) would hold; √(1000·400) = 632 holds where the point would grow."""
    reading = NoiseScaleReading(b_simple=point, ci_low=low, ci_high=2 * point)
    job = Job(size=128, half=64, declared_half=64, noise=lambda _step: reading).run(40)
    assert [(d.old, d.new) for d in job.decisions()] == ([(128, 256)] if grows else [])
    if grows:
        assert job.decisions()[0].target == round(optimum(math.sqrt(point * low), 64))


@pytest.mark.parametrize(
    ("phi", "end", "said"), [(20.0, 32, "1 decision;"), (1000.0, 256, "4 decisions;")]
)
def test_the_end_event_counts_its_decisions(phi, end, said):
    job = Job(size=16, half=64, declared_half=64, noise=tight(phi, spread=0.05)).run(120)
    job.autopilot.finish()
    assert job.control.size == end
    message = job.events[-1].message
    assert message.startswith(f"autopilot at the end: batch 16 → {end} in {said}"), message


def test_no_look_before_the_memory_is_read_at_the_size_it_runs_and_the_ramp_then_holds():
    job = Job(size=16, half=64, noise=tight(1000.0, spread=0.05)).run(10, sampled=False)
    assert job.decisions() == [] and job.control.size == 16
    assert job.autopilot.waiting == "reading the memory at batch 16"
    assert job.autopilot.ramp_until > job.step  # still ramping: looks come as soon as due
    while not job.decisions():
        job.run(1)
    assert [d.new for d in job.decisions()] == [32]
    job.run(10, sampled=False)  # the new size runs, but no sample is taken after its switch
    assert job.control.size == 32 and job.autopilot.waiting == "reading the memory at batch 32"
    assert job.samples_asked[-1] == job.step  # ... so the extension asks for one at once
    asked = len(job.samples_asked)
    job.run(120)
    assert job.control.size == 256
    assert job.autopilot.ramp_until == 0  # holding: looks at the agent's own pace again
    assert len(job.samples_asked) == asked  # every window had its sample: none asked


def test_while_it_ramps_on_a_fast_loop_the_agent_ticks_every_few_steps():
    """1 ms steps: a look due every SETTLE_STEPS steps wants a tick every half that many,
    not the agent's quarter second (250 steps); once it holds, or on a loop of 100 ms steps,
    the agent's own pace."""
    job = Job(size=16, half=64, c=1e-3 / 80, noise=tight(1000.0, spread=0.05))
    assert job.extension.next_tick_s() is None  # no step time measured yet
    job.run(1)
    assert job.extension.next_tick_s() == pytest.approx(1e-3 * SETTLE_STEPS / 2)
    job.run(120)
    assert job.control.size == 256 and job.extension.next_tick_s() is None
    slow = Job(size=16, half=64, c=0.1 / 80, noise=tight(1000.0, spread=0.05)).run(1)
    assert slow.extension.next_tick_s() >= TICK_S
    off = Job(size=16, half=64, c=1e-3 / 80, on=False).run(3)
    assert off.extension.next_tick_s() is None and off.samples_asked == []


def test_waiting_for_the_last_change_to_train_well_keeps_the_ramps_pace():
    """The 2× rule holds 32 until 16 → 32 trained well: a wait that steps end (the loss
    watch's 200 steps), not a hold: ticks stay every few steps. At the agent's quarter second
    a loop of 1 ms steps waited thousands of steps per doubling (T1: 0.30× the best fixed
    batch at B½ = 256, 0.57× paced)."""
    job = Job(size=16, half=64, c=1e-3 / 80, noise=tight(1000.0, spread=0.05))
    while not job.decisions():
        job.run(1)
    job.run(3)
    assert job.control.size == 32 and job.autopilot.advisor.hold.rule == "trained"
    assert job.autopilot.ramp_until > job.step
    assert job.extension.next_tick_s() == pytest.approx(1e-3 * SETTLE_STEPS / 2, rel=0.5)
    changed = job.control.watch.latest.step
    while len(job.decisions()) < 2:
        job.run(1)
    assert job.decisions()[1].step - changed <= WATCH_STEPS + SETTLE_STEPS


def test_an_unresolved_estimate_or_a_gradient_norm_at_zero_decides_nothing_and_says_why():
    """Waiting, it says what the estimate does tell: a batch far below B_simple may read
    only a lower bound for thousands of steps, and the user sees that this is the wait."""
    enough = {"needed": 30, "effective": 45.0}
    cases = {
        ": ≈ 900, its interval unbounded": NoiseScaleReading(
            b_simple=900.0, ci_low=300.0, ci_high=None, **enough
        ),
        ": ≥ 200, |G|² within its noise": NoiseScaleReading(lower_bound=200.0, **enough),
        ": |G|² not above zero beyond its error": NoiseScaleReading(**enough),
        " (12 of 30 effective steps)": NoiseScaleReading(needed=30, effective=12.0),
        " (a bounded interval)": NoiseScaleReading(),
    }
    for said, reading in cases.items():
        job = Job(noise=lambda _s, r=reading: r).run(60)
        assert job.decisions() == [] and job.control.size == 16
        shown = job.autopilot.reading()
        assert shown.waiting == f"waiting for B_simple to resolve{said}"
        assert shown.next_decision_step is None  # due at step 50, but waiting on the estimate
    why = "none — BatchNorm in training mode couples the examples; waiting will not bring one"
    job = Job(noise=lambda _s: NoiseScaleReading(status=why)).run(60)
    assert job.decisions() == [] and job.autopilot.reading().waiting == f"B_simple: {why}"
    job.autopilot.finish()  # its last line says what held it, not only that nothing was claimed
    end = job.events[-1].message
    assert end.startswith(f"autopilot at the end: batch 16 → 16 in 0 decisions; B_simple: {why}")
    # a job that ends before a look; its reading counts the steps an estimate would need
    short = Job(noise=lambda _s: NoiseScaleReading(status=why, needed=30)).run(2)
    assert short.autopilot.reading().waiting.startswith("next decision at step")
    short.autopilot.finish()
    assert f"in 0 decisions; B_simple: {why}; " in short.events[-1].message


def falling(after: int, phi: float, spread: float) -> Noise:
    """B_simple of 1000 until step ``after``, then ``phi`` with a ±``spread`` interval."""
    high, low = tight(1000.0, spread=0.05), tight(phi, spread=spread)
    return lambda step: high(step) if step < after else low(step)


def test_it_shrinks_only_when_even_the_high_end_of_the_interval_says_so_and_never_below_the_start():
    # each doubling waits for the size before to train well (the 2× rule: 200 steps)
    job = Job(size=16, half=64, noise=falling(1200, 20.0, 0.1)).run(250)
    shrinks = job.decisions("shrink")
    assert job.decisions("grow") and shrinks, job.sizes
    assert all(d.b_simple_high == pytest.approx(22.0) for d in shrinks)
    assert job.control.size == 32  # √(64·22) ≈ 38, and never below the start's 16
    assert min(job.sizes[60:]) >= 16
    wide = Job(size=16, half=64, noise=falling(1200, 20.0, 50.0)).run(250)
    assert not wide.decisions("shrink") and wide.control.size == 256
    start = Job(size=1024, half=16, noise=tight(5.0)).run(40)  # B* ≈ 9 but 1024 was chosen
    assert start.decisions() == [] and start.control.size == 1024
    assert start.autopilot.reading().target == 1024


def test_it_never_goes_above_the_memory_ceiling_or_the_policys_maximum():
    job = Job(size=16, half=64, noise=tight(1000.0))
    job.control.probe_max = 64
    job.run(120)
    assert max(job.sizes) == 64 and job.control.size == 64
    reading = job.autopilot.reading()
    assert reading.ceiling == 64 and reading.ceiling_why == "the probe"
    assert reading.target == 64
    job = Job(size=16, half=64, noise=tight(1000.0), max_size=32).run(120)
    assert max(job.sizes) == 32


def test_a_declared_half_batch_steers_instead_of_the_fit():
    fitted = Job(size=16, half=16, noise=tight(1000.0, spread=0.05)).run(150)
    declared = Job(size=16, half=16, noise=tight(1000.0, spread=0.05), declared_half=1024)
    declared.run(150)
    # √(16·950) ≈ 123, but 64 → 128 predicts 1.045×: under the threshold, it holds
    assert fitted.control.size == 64
    assert declared.control.size == 1024  # √(1024·950) ≈ 986
    assert declared.autopilot.reading().half_batch_how == "declared B½ = 1024"


# -- guards ---------------------------------------------------------------------------------


def test_a_divergence_after_its_change_reverts_it_and_that_size_stays_out_of_reach():
    job = Job(size=16, half=64, noise=tight(1000.0, spread=0.05))
    while job.control.size == 16:  # a slowly falling loss at 16 ...
        job.run(1, loss=lambda step: 2.0 - step / 1000)
    assert job.control.size == 32 and job.step < 100
    rising = lambda step: 2.0 - step / 1000 if job.control.size == 16 else 5.0  # noqa: E731
    job.run(40, loss=rising)  # ... that rises far above its level at 32
    reverts = job.decisions("revert")
    assert len(reverts) == 1 and reverts[0].old == 32 and reverts[0].new == 16
    assert "diverged" in reverts[0].note
    assert job.control.size == 16
    assert any(e.kind == "loss_diverged" for e in job.events)
    job.run(60, loss=lambda step: 2.0 - step / 1000)
    assert job.control.size == 16 and len(job.decisions("grow")) == 1  # 32 stays out of reach
    assert job.autopilot.reading().target == 31
    assert job.autopilot.reading().held == "holds: 32 diverged"  # the rule, said (issue 41)


def test_the_users_keys_win_and_pause_it():
    job = Job(size=16, half=64, noise=tight(1000.0))
    job.run(20)
    decided = len(job.decisions())
    job.control.request(8, confirm=True, reason="step down", source="monitor")
    job.run(80)
    reading = job.autopilot.reading()
    assert reading.state == "paused" and "monitor" in reading.why
    assert job.control.size == 8 and len(job.decisions()) == decided > 0
    job.autopilot.switch(True)
    job.run(80)
    assert job.control.size > 8


def test_a_key_that_undoes_its_change_before_a_step_applied_it_still_pauses_it():
    """``-`` pressed while its grow to 32 waits for the step boundary: the key asks for 16,
    the size the job already runs, so no change is applied; the key still wins."""
    job = Job(size=16, half=64, noise=tight(1000.0))
    for _ in range(100):
        job.run(1)
        if (upcoming := job.control.upcoming) is not None:
            break
    assert upcoming is not None and upcoming.source == "autopilot" and upcoming.value == 32
    job.control.request_step("down", confirm=True, source="monitor")
    reading = job.autopilot.reading()
    assert reading.state == "paused" and "set to 16 by monitor" in reading.why
    decided = len(job.decisions())
    job.run(80)
    assert job.control.size == 16 and len(job.decisions()) == decided
    assert not any(change.source == "autopilot" for change in job.control.changes)


def test_it_refuses_when_the_learning_rate_cannot_follow():
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    job = Job(optimizer=optimizer, lr_scaling=None, on=False)
    with pytest.raises(CommandRefused, match="lr_scaling=None"):
        job.autopilot.switch(True)
    job.run(80)
    assert job.autopilot.reading().state == "refused" and job.decisions() == []


def step_lr(step_size: int) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.StepLR]:
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size, gamma=0.5)


def test_a_scheduler_stepped_every_step_stops_it_before_any_change_saying_how_often():
    optimizer, scheduler = step_lr(step_size=30)
    job = Job(
        size=16,
        noise=tight(1000.0, 0.05),
        optimizer=optimizer,
        scheduler=scheduler,
        scheduler_every=1,
    ).run(80)
    reading = job.autopilot.reading()
    assert reading.state == "refused" and job.decisions() == [] and job.control.size == 16
    assert "keyed on steps" in reading.why and "StepLR stepped 10 times in 10 optimizer" in (
        reading.why
    )
    with pytest.raises(CommandRefused, match="keyed on steps"):
        job.autopilot.switch(True)


def test_a_scheduler_stepped_once_an_epoch_lets_it_grow_and_its_steps_are_not_the_jobs_own():
    """StepLR stepped at each epoch's end (100 steps), halving the rate every 2 epochs: the
    schedule is kept in epochs as the batch grows, so the autopilot steers; the rate the
    scheduler moves is not "the job's own schedule"."""
    optimizer, scheduler = step_lr(step_size=2)
    job = Job(
        size=16,
        half=64,
        noise=tight(1000.0, 0.05),
        optimizer=optimizer,
        scheduler=scheduler,
        scheduler_every=100,
    )
    job.run(120)
    reading = job.autopilot.reading()
    assert reading.state == "on", reading.why
    assert job.control.size == 256 and len(job.decisions()) >= 3
    assert scheduler.last_epoch == 12 and optimizer.param_groups[0]["lr"] == pytest.approx(
        0.1 * 256 / 16 * 0.5**6
    )
    job.scheduler_every = 1  # the job starts stepping it every step: it stops, saying why
    job.run(2)
    assert job.autopilot.reading().state == "refused"
    assert "keyed on steps" in job.autopilot.reading().why


def test_a_scheduler_bsmon_was_not_given_refuses_it():
    optimizer, _scheduler = step_lr(step_size=2)  # not given to the controller
    job = Job(optimizer=optimizer, on=False)
    with pytest.raises(CommandRefused, match="scheduler bsmon was not given"):
        job.autopilot.switch(True)


def test_a_learning_rate_the_job_moves_itself_stops_it_but_its_own_rescaling_does_not():
    job = Job(size=16, half=64, noise=tight(1000.0, spread=0.05))
    job.run(120)  # it grew several times, each rescaling the rate: no refusal
    assert job.autopilot.reading().state == "on" and len(job.decisions()) >= 3
    job.optimizer.param_groups[0]["lr"] *= 0.5  # the job's own decay, like nanoGPT's get_lr
    job.run(1)
    assert job.autopilot.reading().state == "on"  # seen once: confirmed at the next look
    job.optimizer.param_groups[0]["lr"] *= 0.5
    job.run(1)
    reading = job.autopilot.reading()
    assert reading.state == "refused" and "the job's own schedule" in reading.why
    assert any(e.kind == "autopilot_state" and e.level == "warning" for e in job.events)


def test_the_claimed_gain_is_measured_throughput_times_efficiency_against_the_start():
    job = Job(size=16, half=64, noise=tight(1000.0, spread=0.05))
    job.run(120)
    sizes = job.control.watch.sizes
    seconds = {s: 0.0 for s in sizes}
    for size in job.sizes:
        seconds[size] += job.step_time(size) * 10
    rate = {s: sizes[s].mean for s in sizes}
    # every window at a size other than 16 came after the estimate resolved (φ = 1000)
    progress = sum(seconds[s] * rate[s] / rate[16] * (1000 + 16) / (1000 + s) for s in seconds)
    claimed = job.autopilot.reading().claimed_gain
    assert claimed == pytest.approx(progress / sum(seconds.values()), rel=0.02)
    assert claimed > 1.5  # 16 → 256 with B½ = 64 and φ = 1000
    last = [e for e in job.events if e.kind == "autopilot"][-1]
    assert last.data["claimed_gain"] is not None and "vs batch 16" in last.message


def test_the_claims_base_is_the_start_size_as_bsmon_runs_it_after_the_noise_scales_warm_up():
    """The warm-up measures three steps in four, so the start size's windows then read slow:
    they are left out. A run that never changed claims 1.00×; a ramp that left during the
    warm-up is measured against the start size's unmeasured steps, as the batch began."""
    window = {"step_time_s": 1e-3, "steps_in_window": 100, "b_simple": None}
    warming, tracking = NoiseScaleReading(phase="warming up"), NoiseScaleReading(phase="tracking")

    def at(size: int, rate: float, noise: NoiseScaleReading) -> Metrics:
        return Metrics(t=1.0, step=100, batch_size=size, samples_per_s=rate, noise=noise, **window)

    def driven(size: int) -> GainLedger:
        """Switched on at the start, and one decision made (none: no claim at all)."""
        ledger = GainLedger(size)
        ledger.begin(size, step=0)
        ledger.decided()
        return ledger

    held = driven(16)
    held.add(at(16, 8e3, warming), 1000.0, 0.5e-3)
    assert held.claim()[0] is None  # only the warm-up's window: nothing counted yet
    held.add(at(16, 16e3, tracking), 1000.0, 0.5e-3)
    claimed, how = held.claim()
    assert claimed == pytest.approx(1.0) and "against a fixed batch of 16" in how
    ramp = driven(16)
    ramp.add(at(16, 8e3, warming), 1000.0, 0.5e-3)  # plain steps: 32k samples/s
    ramp.add(at(32, 32e3, warming), 1000.0, 0.25e-3)  # a plain step at 32 is not the start's
    efficiency = (1000 + 16) / (1000 + 32)
    assert ramp.claim()[0] == pytest.approx(32e3 * efficiency / 32e3)


def test_a_run_that_ended_in_the_noise_scales_warm_up_says_so_not_nothing_measured():
    """B_simple resolved during the warm-up, and the run ended right after its first decision,
    before the warm-up was over: the last line says the start size's windows were the
    warm-up's (issue 43), not "nothing measured". Ended before any decision, it claims
    nothing, and says so (issue 41)."""
    warming = NoiseScaleReading(b_simple=500.0, ci_low=450.0, ci_high=550.0, phase="warming up")
    job = Job(size=16, noise=lambda _step: warming, plain_step_s=1e-3)
    while not job.decisions():
        job.run(1)
    job.autopilot.finish()
    line = job.events[-1].message
    assert "nothing measured" not in line
    assert line.endswith(
        "no claim: batch 16 ran only in the noise scale's warm-up, whose windows are left out "
        "(it measures three steps in four)"
    )
    short = Job(size=16, noise=lambda _step: warming, plain_step_s=1e-3).run(3)
    short.autopilot.finish()
    assert short.events[-1].message.endswith("; no claim: it made no change")


def test_a_second_optimizer_or_a_scheduler_made_later_stops_it_saying_why():
    job = Job(size=16, half=64, noise=tight(1000.0, spread=0.05)).run(10)
    job.control.add_optimizer(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1))
    job.run(1)
    reading = job.autopilot.reading()
    assert reading.state == "refused" and "two optimizers" in reading.why
    job = Job(size=16, half=64, noise=tight(1000.0, spread=0.05)).run(10)
    torch.optim.lr_scheduler.LambdaLR(job.optimizer, lambda step: 1.0)  # leaves initial_lr
    job.run(1)
    assert "scheduler" in job.autopilot.reading().why


# -- what it claims: only the spans it drove (issue 41) ------------------------------------------


def claim_over(job: Job, spans: list[tuple[int, int]], phi: float) -> float:
    """The claim worked out by hand: the windows ``job.sizes[start:stop]`` of each span, worth
    their samples at the span's first size (its base), over the time they took."""
    rate = {size: size / job.step_time(size) for size in set(job.sizes)}
    needed = taken = 0.0
    for start, stop in spans:
        base = job.sizes[start]
        for size in job.sizes[start:stop]:
            seconds = job.step_time(size) * 10
            needed += seconds * rate[size] / rate[base] * (phi + base) / (phi + size)
            taken += seconds
    return needed / taken


def test_changes_made_while_it_was_off_are_not_its_own_and_it_claims_against_where_it_began():
    """The demo's run: the user's keys took 64 to 256, then the autopilot was switched on and
    shrank it. Its end line starts at 256, its claim is against a fixed 256, over the windows
    since it was switched on (it said 64 → 64 and claimed against 64 over the whole run)."""
    job = Job(size=64, half=64, noise=tight(20.0), on=False).run(20)
    job.control.request(256, confirm=True, reason="the user's key", source="monitor")
    job.run(20)
    on_at = len(job.sizes)
    job.autopilot.switch(True)
    job.run(120)
    assert [(d.old, d.new) for d in job.decisions()] == [(256, 128), (128, 64)]
    reading = job.autopilot.reading()
    assert reading.start_size == 256
    assert reading.claimed_gain == pytest.approx(claim_over(job, [(on_at, None)], 20.0))
    job.autopilot.finish()
    end = job.events[-1]
    assert end.message.startswith("autopilot at the end: batch 256 → 64 in 2 decisions; ")
    assert "claimed against a fixed batch of 256: " in end.message
    assert end.data["start_size"] == 256 and end.data["claimed_gain"] == reading.claimed_gain


def test_switched_on_after_the_keys_changed_the_batch_and_holding_it_claims_nothing_and_says_why():
    """minGPT's run: the keys took 16 to 32, the autopilot was switched on and held. It made
    no change, so it claims nothing, and its end line says what held it (it said 16 → 32 and
    claimed the keys' gain)."""
    job = Job(size=16, half=16, noise=tight(30.0, spread=0.05), on=False).run(10)
    job.control.request(32, confirm=True, reason="the user's key", source="monitor")
    job.run(10)
    job.autopilot.switch(True)
    job.run(60)
    assert job.decisions() == [] and job.control.size == 32
    reading = job.autopilot.reading()
    assert reading.claimed_gain is None and reading.claimed_note == "it made no change"
    assert reading.held == "holds: 1.00× < 1.05×"
    job.autopilot.finish()
    assert job.events[-1].message == (
        "autopilot at the end: batch 32 → 32 in 0 decisions; holding at 32: 16 predicted 1.00× "
        "the progress per second, and a change needs 1.05×; no claim: it made no change"
    )


def test_switched_off_and_on_its_claim_covers_each_span_against_its_own_start():
    """On at 16 it grows; a key sets 32 (paused: those windows are the user's); on again at
    32 it grows. The end line names both spans, the claim weighs each against its own base."""
    job = Job(size=16, half=64, noise=tight(1000.0, spread=0.05))
    while job.control.size < 64:
        job.run(1)
    paused_at = len(job.sizes)
    job.control.request(32, confirm=True, reason="the user's key", source="monitor")
    job.run(20)
    assert job.autopilot.reading().state == "paused"
    on_again, step = len(job.sizes), job.step
    job.autopilot.switch(True)
    job.run(120)
    assert job.control.size == 256
    reading = job.autopilot.reading()
    assert reading.start_size == 32
    spans = [(0, paused_at), (on_again, None)]
    assert reading.claimed_gain == pytest.approx(claim_over(job, spans, 1000.0))
    job.autopilot.finish()
    message = job.events[-1].message
    assert message.startswith(
        "autopilot at the end: batch 16 → 64 in 2 decisions, then 32 → 256 in 3 decisions; "
    )
    assert f"(16 at step 0, 32 at step {step:,})" in message


# -- what holds it, said once per change of rule (issue 41) -----------------------------------


def holds(job: Job) -> list[Event]:
    return [e for e in job.events if e.kind == "autopilot_state" and "held" in e.data]


def capped(job: Job) -> Job:
    job.control.probe_max = 64
    return job


@pytest.mark.parametrize(
    ("make", "short", "said"),
    [
        (  # one size measured: B½ is taken equal to it, and the threshold holds it
            lambda: Job(size=16, half=16, noise=tight(30.0, spread=0.05)),
            "holds: 0.98× < 1.05×",
            "autopilot holding at 16: 32 predicted 0.98× the progress per second, and a change "
            "needs 1.05× (B½ taken as 16: one size measured so far)",
        ),
        (  # B* ≈ 9 but 1024 was chosen
            lambda: Job(size=1024, half=16, noise=tight(5.0)),
            "holds: not below 1024",
            "autopilot holding at 1024: never below the size the run started at, 1024",
        ),
        (  # from 32 one change reaches 64 without waiting for 32 to train well
            lambda: capped(Job(size=32, half=64, noise=tight(1000.0))),
            "holds: 128 may not fit",
            "autopilot holding at 64: 128 may not fit (",
        ),
        (
            lambda: Job(noise=lambda _s: NoiseScaleReading(needed=30, effective=12.0)),
            None,  # no target to show it beside: the panel's waiting line says it
            "autopilot waiting for B_simple to resolve (12 of 30 effective steps)",
        ),
    ],
)
def test_a_look_that_holds_says_which_rule_held_it_once(make, short, said):
    job = make().run(120)
    events = holds(job)
    assert len(events) == 1, [e.message for e in events]  # once, though it held at every look
    assert events[0].message.startswith(said) and events[0].level == "info"
    reading = job.autopilot.reading()
    assert reading.held == (short or "holds: B_simple unknown")
    assert events[0].data["held"] == reading.held
    assert len(reading.held) <= 24  # the Batch panel's line at 80 columns
    if short is None:
        assert reading.target is None and reading.waiting in said


def test_a_new_rule_or_a_decision_makes_a_hold_news_again_and_paused_it_holds_nothing():
    job = Job(size=32, half=64, noise=tight(1000.0, spread=0.05))
    job.control.probe_max = 64
    job.run(120)
    assert [e.data["held"] for e in holds(job)] == ["holds: 128 may not fit"]
    job.control.probe_max = None  # the ceiling lifts: it grows, then the threshold holds it
    job.run(120)
    assert job.control.size == 256
    # at 128, 256 waits for 128 to train well (4× the 64 that last did); then the threshold
    assert [e.data["held"] for e in holds(job)][1:] == [
        "holds: 2× from 64",
        job.autopilot.reading().held,
    ]
    assert job.autopilot.reading().held.startswith("holds: 0.")
    job.control.request(128, confirm=True, reason="the user's key", source="monitor")
    assert job.autopilot.reading().held is None


class SlowFirstWindow(Job):
    """A job whose first window at a size it has just changed to runs 1.8× slow (on a busy
    machine: a quarter second beside another process)."""

    def step_time(self, size: int) -> float:
        fresh = self.control.watch.latest is not None and size not in self.control.watch.sizes
        return super().step_time(size) * (1.8 if fresh else 1.0)


def test_it_does_not_go_back_on_the_first_window_of_the_size_it_went_to():
    """The demo's 64 → 128 → 64 in 33 steps: 128's first window read B½ ≈ 0 and 64 paid by
    the line through one window. Going back waits for the windows the throughput verdict
    needs; then the line through them keeps 128."""
    job = SlowFirstWindow(size=64, half=64, noise=tight(300.0, spread=0.05)).run(30)
    assert [(d.old, d.new) for d in job.decisions()] == [(64, 128)]
    measuring = [e.data["held"] for e in holds(job) if "measuring" in e.data["held"]]
    assert measuring == ["holds: measuring 128"]
    job.run(30)
    assert [(d.old, d.new) for d in job.decisions()] == [(64, 128)]
    assert job.control.size == 128
