"""The statistics behind safe batch-size changes, on synthetic data whose answer is known:
throughput means and standard errors, verdicts, the loss watch, the risk rules and the
learning-rate rule per optimizer."""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch
from torch import nn

from bsmon.probes.batch import loss_watch, verdict
from bsmon.probes.batch.loss_watch import LossWatch
from bsmon.probes.batch.lr_scaling import describe, owned_by_scheduler, rule_for
from bsmon.probes.batch.memory_model import MemoryModel
from bsmon.probes.batch.safety import memory_reason, ratio_reason
from bsmon.probes.batch.verdict import SizeThroughput, judge

GIB = 2**30


def windows(rng: random.Random, rate: float, noise: float, k: int) -> SizeThroughput:
    """``k`` windows of 0.5 s (± 20%) whose rate is ``rate`` with relative noise ``noise``."""
    size = SizeThroughput()
    for _ in range(k):
        seconds = 0.5 * rng.uniform(0.8, 1.2)
        size.add(rate * (1 + rng.gauss(0, noise)) * seconds, seconds)
    return size


# -- throughput: mean, standard error, verdicts ----------------------------------------------


def test_the_mean_is_samples_over_seconds_like_the_summary():
    size = SizeThroughput()
    size.add(100, 1.0)
    size.add(300, 2.0)
    size.add(0, 0.0)  # no time: left out
    assert size.mean == pytest.approx(400 / 3.0)
    assert size.windows == 2


def test_the_standard_error_matches_the_scatter_of_repeated_means():
    rng = random.Random(1)
    means, ses = [], []
    for _ in range(2000):
        size = windows(rng, 1000.0, 0.1, 20)
        means.append(size.mean)
        ses.append(size.se)
    spread = statistics.stdev(means)
    assert statistics.mean(ses) == pytest.approx(spread, rel=0.1)
    assert spread == pytest.approx(1000 * 0.1 / math.sqrt(20), rel=0.1)


def test_a_real_difference_is_resolved_and_measured():
    rng = random.Random(2)
    before, after = windows(rng, 1000.0, 0.1, 40), windows(rng, 1100.0, 0.1, 40)
    found = judge(before, after, waited_s=1.0)
    assert found is not None and found.outcome == verdict.FASTER
    assert found.gain == pytest.approx(0.10, abs=0.03)
    assert found.text(64, 128).startswith(f"batch 64 → 128 bought {found.gain:+.0%} throughput (")


def test_no_difference_waits_then_says_so():
    rng = random.Random(3)
    before, after = windows(rng, 1000.0, 0.1, 40), windows(rng, 1000.0, 0.1, 40)
    assert judge(before, after, waited_s=1.0) is None
    found = judge(before, after, waited_s=verdict.MAX_WAIT_S)
    assert found is not None and found.outcome == verdict.SAME
    assert "no measurable difference" in found.text(64, 128)
    assert judge(before, windows(rng, 1, 0.1, 9), waited_s=1e9) is None  # too few windows
    brief = windows(rng, 1000.0, 0.1, 3)  # the old size ran 1.5 s before the change
    assert judge(brief, after, waited_s=1.0) is None
    found = judge(brief, after, waited_s=verdict.MAX_WAIT_S)
    assert found.outcome == verdict.UNCOMPARED
    assert found.text(64, 128).startswith("batch 64 → 128: no verdict, too little was measured")


def test_sequential_looks_rarely_give_a_false_verdict():
    """Equal rates, judged after every window as the live controller does: the false
    verdict rate over a whole wait stays low (it is a sequential test, so above 0.27%)."""
    rng = random.Random(4)
    false = 0
    trials = 300
    for _ in range(trials):
        before = windows(rng, 1000.0, 0.1, 60)
        after = SizeThroughput()
        for window in range(120):  # 60 s of 0.5 s windows
            seconds = 0.5
            after.add(1000.0 * (1 + rng.gauss(0, 0.1)) * seconds, seconds)
            found = judge(before, after, waited_s=window * 0.5)
            if found is not None:
                false += found.outcome != verdict.SAME
                break
    assert false / trials < 0.04  # 1.75% measured (docs/batch-control.md)


# -- the loss watch --------------------------------------------------------------------------


def feed(watch: LossWatch, values, steps: int = 10):
    outcomes = [watch.observe(steps, v) for v in values]
    return [o for o in outcomes if o is not None]


def test_a_noisy_loss_that_holds_is_held():
    rng = random.Random(5)
    diverged = 0
    for _ in range(200):
        watch = LossWatch()
        feed(watch, [1.0 + rng.gauss(0, 0.05) for _ in range(20)])
        watch.start(change_step=200)
        outcomes = feed(watch, [1.0 + rng.gauss(0, 0.05) for _ in range(40)])
        assert len(outcomes) == 1
        diverged += outcomes[0].status == loss_watch.DIVERGED
    assert diverged == 0


def test_a_loss_that_rises_well_above_its_level_diverged():
    rng = random.Random(6)
    watch = LossWatch()
    feed(watch, [0.3 + rng.gauss(0, 0.02) for _ in range(20)])
    watch.start(change_step=200)
    (outcome,) = feed(watch, [2.3 + rng.gauss(0, 0.02) for _ in range(5)])
    assert outcome.status == loss_watch.DIVERGED
    assert outcome.before == pytest.approx(0.3, abs=0.02)
    assert outcome.after == pytest.approx(2.3, abs=0.05)


def test_a_loss_near_zero_that_wobbles_after_a_change_held_and_one_that_undoes_training_did_not():
    """MNIST-like: from 2.3 down to 0.02; after a smaller batch the windows read 0.05 (more
    than 10% and 5 noises above, yet a sliver of the 2.28 the run gained): held. Back at 1.0
    it gave back half of what it learnt: diverged."""
    rng = random.Random(7)
    outcomes = {}
    for after in (0.05, 1.0):
        watch = LossWatch()
        feed(watch, [2.3, 1.0, 0.5, 0.2, 0.1] + [0.02 + rng.gauss(0, 0.002) for _ in range(20)])
        watch.start(change_step=250)
        (outcome,) = feed(watch, [after + rng.gauss(0, 0.005) for _ in range(25)])
        outcomes[after] = outcome.status
    assert outcomes == {0.05: loss_watch.HELD, 1.0: loss_watch.DIVERGED}


def test_one_spike_is_not_a_divergence_and_a_nan_is():
    watch = LossWatch()
    feed(watch, [1.0, 1.01, 0.99, 1.0, 1.02])
    watch.start(change_step=50)
    assert feed(watch, [5.0, 1.0, 1.0, 1.0]) == []
    assert watch.observe(10, None, nonfinite=True).status == loss_watch.DIVERGED


def test_a_divergence_that_comes_back_under_the_threshold_recovered_and_one_that_stays_did_not():
    """The demo's spike (newcomer review 2, finding 3): the loss at 0.74 before batch 128 →
    262, about 1.3 after it, then back near 0.7 at the same size. The divergence is said
    once either way; only the loss that came back (3 windows under the threshold) recovered,
    once, and the watch ends there."""
    rng = random.Random(8)
    said = {}
    for later in (0.7, 1.3):
        watch = LossWatch()
        feed(watch, [2.3, 1.5, 1.0] + [0.74 + rng.gauss(0, 0.01) for _ in range(20)])
        watch.start(change_step=8968)
        rise = feed(watch, [1.3 + rng.gauss(0, 0.05) for _ in range(5)])
        assert not watch.watching  # judged: the NaN scan for a divergence is over
        after = feed(watch, [later + rng.gauss(0, 0.01) for _ in range(40)])
        said[later] = [o.status for o in rise + after]
        if after:
            assert after[0].before == pytest.approx(0.74, abs=0.02)
            assert after[0].after == pytest.approx(0.7, abs=0.05)
    assert said == {
        0.7: [loss_watch.DIVERGED, loss_watch.RECOVERED],
        1.3: [loss_watch.DIVERGED],
    }


def test_a_nan_recovers_only_once_finite_windows_come_back_under_the_threshold():
    """The job says a NaN once, so the caller's flag stays up: the window means decide. A
    window with no finite value, or an infinite mean, starts the stretch again."""
    watch = LossWatch()
    feed(watch, [1.0, 1.01, 0.99, 1.0, 1.02])
    watch.start(change_step=50)
    assert watch.observe(10, None, nonfinite=True).status == loss_watch.DIVERGED
    stays = [None] * 10 + [5.0, 5.0, 5.0, 1.0, math.inf, 1.0, 1.0]
    assert [watch.observe(10, v, nonfinite=True) for v in stays] == [None] * len(stays)
    assert watch.observe(10, 1.0, nonfinite=True).status == loss_watch.RECOVERED


def test_without_a_logged_loss_the_change_is_unwatched_after_its_steps():
    watch = LossWatch()
    watch.start(change_step=0)
    outcomes = feed(watch, [None] * 30)
    assert [o.status for o in outcomes] == [loss_watch.UNWATCHED]


# -- the risk rules --------------------------------------------------------------------------


def test_more_than_twice_from_the_last_size_that_trained_well_asks():
    assert ratio_reason(128, 64) is None and ratio_reason(32, 64) is None
    assert "4× the last batch size that trained well (64)" in ratio_reason(256, 64)
    assert "1/64 of the last batch size that trained well (64)" in ratio_reason(1, 64)


def test_memory_rules_on_a_device_and_on_the_cpu():
    device, host = MemoryModel(), MemoryModel()
    budget = 10 * GIB
    kw = {"device": device, "device_budget": budget, "host": host, "host_budget": budget}
    assert "unmeasured" in memory_reason(128, 64, **kw)
    assert memory_reason(32, 64, **kw) is None  # smaller than what runs now
    host.observe(64, 1 * GIB, steps=3)  # the CPU: resident memory, bounded proportionally
    assert memory_reason(512, 64, **kw) is None  # ≤ 8 GiB: under 90% of 10 GiB
    why = memory_reason(1024, 64, **kw)
    assert "could reach 16.0 GiB, 160% of the 10.0 GiB host" in why
    device.observe(64, 4 * GIB, steps=3)  # a device reading: the device decides
    assert memory_reason(128, 64, **kw) is None  # ≤ 8 GiB
    assert "could reach 16.0 GiB, 160% of the 10.0 GiB device" in memory_reason(256, 64, **kw)
    device.observe(32, 3 * GIB, steps=3)  # two sizes: the fitted line (1 GiB + 1/32 GiB a sample)
    assert memory_reason(200, 64, **kw) is None  # 8.25 GiB predicted
    assert "predicts a peak of" in memory_reason(512, 64, **kw)


# -- the learning-rate rule ------------------------------------------------------------------


def test_auto_picks_the_rule_the_optimizer_needs():
    params = list(nn.Linear(2, 1).parameters())
    assert rule_for("auto", torch.optim.SGD(params, lr=0.1, momentum=0.9)).policy == "linear"
    adam = rule_for("auto", torch.optim.AdamW(params))
    assert adam.policy == "sqrt" and adam.label == "sqrt rule for AdamW"
    lbfgs = rule_for("auto", torch.optim.LBFGS(params))
    assert lbfgs.policy is None and "no rule known for LBFGS" in lbfgs.why
    assert rule_for(None, torch.optim.SGD(params, lr=0.1)).policy is None
    assert rule_for("sqrt", torch.optim.SGD(params, lr=0.1)).label == "sqrt rule, chosen"
    assert describe([(0.001, 0.0014142)]) == "lr 0.001 → 0.00141"


def test_a_scheduler_is_seen_by_the_rates_it_leaves():
    optimizer = torch.optim.SGD(nn.Linear(2, 1).parameters(), lr=0.1)
    assert not owned_by_scheduler(optimizer)
    torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
    assert owned_by_scheduler(optimizer)


def test_a_mixed_loss_is_not_judged_after_a_change_but_a_nan_still_is():
    """bsmon run with a GAN's two optimizers: the loss alternates between theirs, so a rise
    after a change says nothing; a NaN still does."""
    from bsmon.probes.batch.watch import ChangeWatch
    from bsmon.probes.wire.protocol import BatchChange, Metrics

    def window(step: int, loss: float) -> Metrics:
        return Metrics(
            t=float(step), step=step, batch_size=16, step_time_s=0.1, samples_per_s=160.0,
            b_simple=None, steps_in_window=10, scalars={"loss": loss},
        )  # fmt: skip

    statuses = {}
    for mixed in (False, True):
        watch = ChangeWatch(16, lambda: 0)
        watch.loss_mixed = mixed
        for k in range(20):
            watch.observe(window(10 * k, 0.8))
        change = BatchChange(step=200, t=200.0, old=16, new=32, reason="+", source="monitor")
        watch.add_change(change)
        events = [e for k in range(21, 50) for e in watch.observe(window(10 * k, 1.6))]
        statuses[mixed] = (change.loss, [e.kind for e in events if e.kind == "loss_diverged"])
    assert statuses == {
        False: (loss_watch.DIVERGED, ["loss_diverged"]),
        True: (loss_watch.UNWATCHED, []),
    }
    watch = ChangeWatch(16, lambda: 0)
    watch.loss_mixed = True
    watch.add_change(BatchChange(step=0, t=0.0, old=16, new=32, reason="+", source="monitor"))
    events = watch.observe(window(10, 0.8), nonfinite_loss=True)
    assert [e.kind for e in events] == ["loss_diverged"]


def test_a_divergence_after_a_change_names_what_moved_with_it():
    from bsmon.probes.batch.watch import ChangeWatch
    from bsmon.probes.wire.protocol import BatchChange, Metrics

    def window(step: int, loss: float) -> Metrics:
        return Metrics(
            t=float(step), step=step, batch_size=16, step_time_s=0.1, samples_per_s=160.0,
            b_simple=None, steps_in_window=10, scalars={"loss": loss},
        )  # fmt: skip

    watch = ChangeWatch(16, lambda: 0)
    for k in range(20):
        watch.observe(window(10 * k, 0.8))
    change = BatchChange(
        step=200, t=200.0, old=16, new=32, reason="+", source="monitor",
        lr_note="lr 0.001 → 0.00141 (sqrt rule for AdamW)",
        optimizer_note="moments reset (4 tensors' averages start again)",
    )  # fmt: skip
    watch.add_change(change)
    events = [e for k in range(21, 50) for e in watch.observe(window(10 * k, 1.6))]
    (diverged,) = [e for e in events if e.kind == "loss_diverged"]
    assert diverged.message.endswith(
        "after batch 16 → 32 at step 200; lr 0.001 → 0.00141 (sqrt rule for AdamW); moments "
        "reset (4 tensors' averages start again): the change is the likely cause"
    )


class BesideAProbe:
    """A batch watch fed one-second metrics windows (``t`` their end, 10 steps each), told
    that a probe's sidecar shared the device from ``started`` to ``ended``; ``rate(t, size)``
    gives each window's samples/s."""

    def __init__(self, started: float, ended: float, rate) -> None:
        from bsmon.probes.batch.watch import ChangeWatch

        self.now = 0
        self.rate = rate
        self.watch = ChangeWatch(16, lambda: 0)
        self.watch.device_shared_since = lambda t: started <= self.now and ended > t

    def observe(self, t: int, size: int) -> list:
        from bsmon.probes.wire.protocol import Metrics

        self.now = t
        rate = self.rate(t, size)
        metrics = Metrics(
            t=float(t), step=10 * t, batch_size=size, step_time_s=size / rate,
            samples_per_s=rate, b_simple=None, steps_in_window=10,
        )  # fmt: skip
        return self.watch.observe(metrics)

    def change(self, t: int, old: int, new: int):
        from bsmon.probes.wire.protocol import BatchChange

        change = BatchChange(
            step=10 * t, t=float(t), old=old, new=new, reason="+", source="monitor"
        )
        self.watch.add_change(change)
        return change


def test_windows_a_probe_slowed_are_not_counted_for_either_size():
    """The sidecar shares the job's device while it probes: what the job did then says nothing
    about its batch size (seen on minGPT: 'batch 16 → 32 bought -90% throughput' with a probe
    started four steps after the change)."""
    rng = random.Random(0)
    probe_started, probe_ended = 21.5, 40.5

    def rate(t: int, size: int) -> float:
        slowed = probe_started < t and t - 1 < probe_ended
        return (20.0 if slowed else size * 10.0) * rng.uniform(0.98, 1.02)

    job = BesideAProbe(probe_started, probe_ended, rate)
    for now in range(20):
        job.observe(now, 16)
    change = job.change(20, 16, 32)
    events = []
    for now in range(21, 80):
        events += job.observe(now, 32)
    (verdict_event,) = [e for e in events if e.kind == "batch_size_result"]
    assert change.verdict == "faster"
    assert 310 < change.samples_per_s_after < 330  # the probe's 20 samples/s left out
    assert 155 < change.samples_per_s_before < 165
    assert verdict_event.data["after"] == change.samples_per_s_after


def test_seconds_a_probe_shared_do_not_count_toward_the_wait_for_a_verdict():
    """'No measurable difference' comes after 60 s that measured the new size: a probe that
    ran 56 s of them (the newcomer's demo) leaves 4 s measured, too few to say it."""
    rng = random.Random(3)
    job = BesideAProbe(21.5, 76.5, lambda _t, _size: 160.0 * rng.uniform(0.98, 1.02))
    for now in range(20):
        job.observe(now, 16)
    change = job.change(20, 16, 32)
    judged_at = next(
        now
        for now in range(21, 200)
        if any(e.kind == "batch_size_result" for e in job.observe(now, 32))
    )
    assert change.verdict == verdict.SAME
    shared = 77 - 21  # the windows ending at 22..77 began before the probe's end
    assert judged_at == 20 + shared + verdict.MAX_WAIT_S
