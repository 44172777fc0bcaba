"""Batch-size control: policy, memory model, learning-rate factors, switching mid-epoch,
confirmations and refusals, accumulation mode, and the OOM guard."""

from __future__ import annotations

import math
import time

import pytest
import torch
from torch import nn

from bsmon.probes import attach
from bsmon.probes.batch.lr_scaling import NoFactor, describe, lr_factor, rescale
from bsmon.probes.batch.memory_model import MemoryModel
from bsmon.probes.batch.policy import BatchPolicy
from bsmon.probes.wire import protocol
from bsmon.probes.wire.client import JobConnection

from ..helpers import wait_until

# -- the policy ----------------------------------------------------------------------------


def test_double_steps_and_limits():
    policy = BatchPolicy("double", min_size=8, max_size=256)
    assert policy.next_size(64, "up") == 128 and policy.next_size(64, "down") == 32
    assert policy.next_size(256, "up") is None and policy.next_size(8, "down") is None
    assert policy.next_size(200, "up") is None  # 400 is above the maximum


def test_additive_and_list_steps():
    assert BatchPolicy(16).next_size(64, "up") == 80
    assert BatchPolicy(16).next_size(64, "down") == 48
    sizes = BatchPolicy([32, 48, 64, 96])
    assert sizes.next_size(48, "up") == 64 and sizes.next_size(48, "down") == 32
    assert sizes.next_size(50, "up") == 64 and sizes.next_size(50, "down") == 48
    assert sizes.next_size(96, "up") is None


def test_accumulation_steps_stay_whole_micro_batches():
    policy = BatchPolicy(100, multiple_of=64)
    assert policy.next_size(128, "up") == 256  # 228 rounded up to a multiple of 64


@pytest.mark.parametrize(
    ("policy", "value", "message"),
    [
        (BatchPolicy(min_size=4), 2, "2 is below the minimum batch size 4"),
        (BatchPolicy(max_size=512), 1024, "1024 is above the maximum batch size 512"),
        (BatchPolicy(multiple_of=32), 48, "48 is not a multiple of the micro-batch size 32"),
        (BatchPolicy([16, 32]), 24, "24 is not one of the allowed sizes [16, 32]"),
    ],
)
def test_each_refusal_says_why(policy, value, message):
    assert message in policy.refusal(value)


def test_bad_policies_are_refused_at_attach(bsmon_dir):
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for kwargs, message in [
        ({"batch_step": "triple"}, "batch_step must be 'double', an int or a list"),
        ({"batch_step": 0}, "additive batch_step must be at least 1"),
        ({"batch_step": [4, -1]}, "batch_step sizes must be positive integers"),
        ({"max_batch_size": 2, "min_batch_size": 4}, "is below min_batch_size"),
        ({"batch_size": 1000, "max_batch_size": 512}, "batch_size: 1000 is above the maximum"),
        ({"micro_batch_size": 3}, "must be a multiple of micro_batch_size 3"),
        ({"lr_scaling": "cubic"}, "lr_scaling must be one of"),
    ]:
        options = {"batch_size": 8, **kwargs}
        with pytest.raises(ValueError, match=message):
            attach(model, optimizer, **options)


# -- the memory model ----------------------------------------------------------------------


def test_memory_model_fits_a_line_and_predicts_with_a_margin():
    model = MemoryModel()
    model.observe(64, 2_000 + 64 * 100, steps=3)
    assert model.fit() is None and model.predicted_max(100_000) is None
    model.observe(128, 2_000 + 128 * 100, steps=3)
    model.observe(128, 1_000, steps=5)  # a lower reading never lowers the peak
    fit = model.fit()
    assert fit.slope == pytest.approx(100) and fit.intercept == pytest.approx(2_000)
    assert model.predicted_max(100_000) == math.floor((0.9 * 100_000 - 2_000) / 100)
    assert model.needs_confirmation(800, 100_000) is None
    why = model.needs_confirmation(900, 100_000)
    assert "predicts a peak" in why and "92% of" in why
    model.observe(256, 0, steps=0)  # no steps at that size yet: ignored
    assert [p.batch_size for p in model.points()] == [64, 128]


# -- learning rate --------------------------------------------------------------------------


def test_lr_factors_for_each_policy():
    assert lr_factor("linear", 64, 128) == 2.0
    assert lr_factor("sqrt", 64, 256) == 2.0
    phi = 1000.0
    gain = (1 + phi / 64) / (1 + phi / 128)
    assert lr_factor("noise", 64, 128, noise_scale=phi) == pytest.approx(gain)
    assert lr_factor("noise", 64, 128, noise_scale=phi, adam_like=True) == pytest.approx(
        math.sqrt(gain)
    )
    assert lr_factor("noise", 128, 64, noise_scale=phi) == pytest.approx(1 / gain)
    with pytest.raises(NoFactor):
        lr_factor("noise", 64, 128, noise_scale=None)


def test_rescale_moves_groups_and_scheduler_base_rates():
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(
        [{"params": [model.weight], "lr": 0.1}, {"params": [model.bias], "lr": 0.01}]
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 1.0)
    changes = rescale(optimizer, 2.0, scheduler)
    assert changes == [(0.1, 0.2), (0.01, 0.02)]
    optimizer.step()
    scheduler.step()  # LambdaLR recomputes from base_lrs: the change must survive
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.2, 0.02])
    tensor_lr = torch.optim.Adam(model.parameters(), lr=torch.tensor(0.5))
    held = tensor_lr.param_groups[0]["lr"]
    rescale(tensor_lr, 0.5)
    assert tensor_lr.param_groups[0]["lr"] is held and float(held) == 0.25


def test_the_groups_a_change_moved_alike_are_counted_in_good_english():
    assert describe([(0.1, 0.2)]) == "lr 0.1 → 0.2"
    assert describe([(0.1, 0.2)] * 2) == "lr 0.1 → 0.2 (and 1 more group alike)"
    assert describe([(0.1, 0.2)] * 3) == "lr 0.1 → 0.2 (and 2 more groups alike)"


# -- switching in a running job --------------------------------------------------------------


class IndexDataset(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.tensor([float(i), 1.0]), i


def make_job(batch_size: int = 8, **options):
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    mon = attach(model, optimizer, batch_size=batch_size, **options)
    return model, optimizer, mon


def train_epoch(model, optimizer, mon, loader, on_step=None):
    seen, sizes = [], []
    for x, ids in loader:
        model(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        seen.extend(ids.tolist())
        sizes.append(len(ids))
        if on_step is not None:
            on_step(mon.step)
    return seen, sizes


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mid_epoch_switch_sees_every_sample_exactly_once(bsmon_dir, workers):
    model, optimizer, mon = make_job(8)
    with mon:
        loader = mon.dataloader(
            IndexDataset(403),
            shuffle=True,
            num_workers=workers,
            generator=torch.Generator().manual_seed(1),
        )

        def switch(step: int) -> None:
            if step == 5:  # 4× and 1/8 of the size that trained well: confirmed
                assert mon.request_batch_size(32, confirm=True).ok
            if step == 9:
                assert mon.request_batch_size(4, confirm=True).ok

        seen, sizes = train_epoch(model, optimizer, mon, loader, switch)
    assert sorted(seen) == list(range(403))
    assert 8 in sizes and 32 in sizes and 4 in sizes
    assert mon.batch_size == 4


def test_socket_commands_switch_at_the_next_step_and_say_when(bsmon_dir):
    model, optimizer, mon = make_job(8, max_batch_size=64)
    with mon, JobConnection(mon.socket_path) as conn:
        hello = conn.hello()
        assert hello.capabilities["set_batch_size"].available
        assert hello.batch.control and hello.batch.next_up == 16 and hello.batch.next_down == 4
        loader = mon.dataloader(IndexDataset(10_000))
        it = iter(loader)

        def one_step():
            x, _ = next(it)
            model(x).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            return len(x)

        for _ in range(3):
            one_step()
        # a larger size is measured to fit once the job's memory has been read at 8
        wait_until(mon.job.batch_control.host_memory.points, message="a memory reading")
        reply = conn.request(protocol.StepBatchSize(direction="up"))
        assert reply.ok, reply.error
        assert reply.result == {"old": 8, "new": 16, "step": 3, "applies_after_step": 4}
        assert mon.batch_size == 8  # not before the step boundary
        assert one_step() == 8  # this batch was already drawn at 8
        assert mon.batch_size == 16
        assert one_step() == 16
        event = conn.wait_for(protocol.Event)
        while event.kind != "batch_size":
            event = conn.wait_for(protocol.Event)
        assert event.step == 4 and event.data["old"] == 8 and event.data["new"] == 16
        assert event.message == "batch 8 → 16 (step up, monitor); lr 0 → 0 (linear rule for SGD)"
        reply = conn.request(protocol.SetBatchSize(value=48, reason="try it"))
        assert not reply.ok and "6× the last batch size that trained well (8)" in reply.error
        reply = conn.request(protocol.SetBatchSize(value=48, reason="try it", confirm=True))
        assert reply.ok and reply.result["new"] == 48


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (protocol.SetBatchSize(value=128), "128 is above the maximum batch size 64"),
        (protocol.SetBatchSize(value=8), "the batch size is already 8"),
        (protocol.StepBatchSize(direction="down"), "8 is already the smallest batch size"),
    ],
)
def test_refusals_over_the_socket(bsmon_dir, command, message):
    _, _, mon = make_job(8, max_batch_size=64, min_batch_size=8)
    with mon, JobConnection(mon.socket_path) as conn:
        reply = conn.request(command)
        assert not reply.ok and message in reply.error
        assert mon.batch_size == 8


def test_zero_and_negative_sizes_are_refused_by_the_protocol(bsmon_dir):
    _, _, mon = make_job(8)
    with mon:
        assert "`value` must be at least 1" in mon.request_batch_size(0).error
        assert "`value` must be at least 1" in mon.request_batch_size(-4).error


def test_risky_sizes_ask_for_confirmation(bsmon_dir):
    _, _, mon = make_job(64)
    with mon:
        control = mon.job.batch_control
        control.memory.observe(32, 10 * 2**30, steps=5)
        control.memory.observe(64, 20 * 2**30, steps=5)
        control.memory_budget = 80 * 2**30
        reply = mon.request_batch_size(256)  # predicted 80 GiB: 100% of the budget
        assert not reply.ok and reply.result["needs_confirmation"]
        assert "predicts a peak of 80.0 GiB at batch 256" in reply.error
        assert "send again with confirm" in reply.error
        assert mon.request_batch_size(128).ok  # 40 GiB: fine
        assert mon.request_batch_size(256, confirm=True).ok
        control.probe_max = 100
        reply = mon.request_batch_size(110)
        assert (
            not reply.ok and "above the largest batch the probe found to fit (100)" in reply.error
        )


def test_callbacks_run_at_the_switch_and_a_raising_one_is_reported(bsmon_dir):
    model, optimizer, mon = make_job(8)
    calls = []

    def said(old: int, new: int) -> None:  # as bsmon run's loader says where the size applies
        calls.append((old, new, mon.step))
        mon.job.emit(protocol.Event(t=time.time(), step=mon.step, kind="zero_code", message="cut"))

    with mon:
        mon.on_batch_size_change(said)
        mon.on_batch_size_change(lambda old, new: 1 / 0)
        mon.request_batch_size(16, confirm=True)  # no memory reading yet: unmeasured
        model(torch.randn(8, 2)).sum().backward()
        optimizer.step()
        assert calls == [(8, 16, 1)]
        assert mon.flush()
        assert mon.stats()["errors"] == 1
        # the change's event, then what a callback said of it: listed in the order of time
        events = [e for e in mon.job.telemetry.events if e.kind in ("batch_size", "zero_code")]
        assert [e.kind for e in events] == ["batch_size", "zero_code"]
        assert events[0].t <= events[1].t
        with pytest.raises(TypeError):
            mon.on_batch_size_change("not callable")


def test_lr_scaling_applies_at_the_switch_and_is_said_in_its_event(bsmon_dir):
    model, optimizer, mon = make_job(8, lr_scaling="linear")
    optimizer.param_groups[0]["lr"] = 0.1
    with mon:
        mon.request_batch_size(32, confirm=True)
        model(torch.randn(8, 2)).sum().backward()
        optimizer.step()
        assert optimizer.param_groups[0]["lr"] == pytest.approx(0.4)
        assert mon.flush()
        (event,) = [e for e in mon.job.telemetry.events if e.kind == "batch_size"]
        assert event.message.endswith("; lr 0.1 → 0.4 (linear rule, chosen)")
        change = mon.job.batch_control.changes[-1]
        assert change.lr_factor == pytest.approx(4.0)


def test_by_default_adam_follows_the_square_root_rule_and_a_scheduler_is_named(bsmon_dir):
    model = nn.Linear(2, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
    torch.optim.lr_scheduler.StepLR(optimizer, step_size=100)  # not given to attach
    with attach(model, optimizer, batch_size=64) as mon:
        assert mon.request_batch_size(128, confirm=True).ok
        model(torch.randn(8, 2)).sum().backward()
        optimizer.step()
        assert optimizer.param_groups[0]["lr"] == pytest.approx(0.001 * math.sqrt(2))
        assert mon.flush()
        (event,) = [e for e in mon.job.telemetry.events if e.kind == "batch_size"]
        assert "; lr 0.001 → 0.00141 (sqrt rule for Adam); " in (event.message)
        # and β2 keeps its half-life in examples (adam_beta2="examples", the default)
        assert optimizer.param_groups[0]["betas"][1] == pytest.approx(0.999**2)
        assert event.message.endswith("; β2 0.999 → 0.998 (half-life kept in examples)")
        assert "a learning-rate scheduler owns the lr" in event.message
        assert mon.job.batch_control.reading().lr_rule == "sqrt rule for Adam"


def test_the_adam_rules_apply_at_the_switch_and_the_event_says_what_moved(bsmon_dir):
    model = nn.Linear(2, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.001, weight_decay=0.1)
    rules = {"adam_moments": "reset", "adam_beta2": "examples", "adam_weight_decay": "timescale"}
    with attach(model, optimizer, batch_size=64, **rules) as mon:
        model(torch.randn(8, 2)).sum().backward()
        optimizer.step()
        assert mon.request_batch_size(128, confirm=True).ok
        model(torch.randn(8, 2)).sum().backward()
        optimizer.step()  # the change applies at this step's boundary, before the next step
        group = optimizer.param_groups[0]
        assert group["betas"][1] == pytest.approx(0.999**2)
        assert group["weight_decay"] == pytest.approx(0.1 * math.sqrt(2))
        assert all(float(state["step"]) == 0 for state in optimizer.state.values())
        assert mon.flush()
        (event,) = [e for e in mon.job.telemetry.events if e.kind == "batch_size"]
        assert event.message.endswith(
            "; lr 0.001 → 0.00141 (sqrt rule for AdamW); β2 0.999 → 0.998 (half-life kept in "
            "examples); weight decay 0.1 → 0.141 (timescale kept in examples); moments reset "
            "(2 tensors' averages start again)"
        )
        assert event.data["optimizer"][0].startswith("β2 0.999 → 0.998")
        note = mon.job.batch_control.changes[-1].optimizer_note
        assert note.startswith("β2 0.999 → 0.998") and note.endswith("start again)")


def test_an_adam_rule_that_does_not_exist_is_refused_before_anything_is_attached(bsmon_dir):
    model = nn.Linear(2, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.001)
    with pytest.raises(ValueError, match="adam_moments must be one of 'keep', 'reset', 'rescale'"):
        attach(model, optimizer, batch_size=64, adam_moments="zero")


def test_noise_lr_scaling_without_an_estimate_leaves_the_rate_and_says_so(bsmon_dir):
    model, optimizer, mon = make_job(8, lr_scaling="noise")
    optimizer.param_groups[0]["lr"] = 0.1
    with mon:
        mon.request_batch_size(16, confirm=True)
        model(torch.randn(8, 2)).sum().backward()
        optimizer.step()
        assert optimizer.param_groups[0]["lr"] == 0.1
        assert mon.flush()
        (event,) = [e for e in mon.job.telemetry.events if e.kind == "batch_size"]
        assert "lr unchanged (noise-scale rule: no noise-scale estimate yet)" in event.message


def test_what_a_change_bought_waits_for_a_resolved_difference_and_agrees_with_the_summary(
    bsmon_dir, monkeypatch
):
    from bsmon.probes.batch import verdict
    from bsmon.probes.summary.build import summarize_record

    monkeypatch.setattr(verdict, "MAX_WAIT_S", 0.0)  # no difference needed: judge at once
    model, optimizer, mon = make_job(8, record=bsmon_dir / "run.jsonl")
    with mon:
        loader = iter(mon.dataloader(IndexDataset(10_000_000)))

        def steps(n):
            for _ in range(n):
                x, _ = next(loader)
                model(x).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
                mon.flush()  # one metrics window per step

        def result():
            return [e for e in mon.job.telemetry.events if e.kind == "batch_size_result"]

        steps(verdict.MIN_WINDOWS + 2)
        mon.request_batch_size(16, confirm=True)
        steps(verdict.MIN_WINDOWS - 2)
        assert mon.flush() and not result()  # too few windows at 16 to judge
        assert mon.job.batch_control.reading().changes[-1].verdict is None
        wait_until(lambda: (steps(1), result())[1], message="a verdict")
        (event,) = result()
    assert event.data["verdict"] in ("faster", "slower", "no measurable difference")
    assert "± " in event.message and "samples/s" in event.message
    change = mon.job.batch_control.changes[-1]
    assert change.verdict == event.data["verdict"] and change.samples_per_s_se_after > 0
    table = {
        s.batch_size: s.samples_per_s for s in summarize_record(mon.session.record).batch_sizes
    }
    # the same steps, the same definition (samples over timed seconds): the verdict's figures
    # are the summary's table's, up to the window that straddles the change (left out live)
    assert event.data["before"] == pytest.approx(table[8], rel=0.25)
    assert event.data["after"] == pytest.approx(table[16], rel=0.25)


def one_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model(torch.randn(8, 2)).sum().backward()
    optimizer.step()


def test_a_size_left_before_its_verdict_says_so(bsmon_dir):
    model, optimizer, mon = make_job(8)
    with mon:
        assert mon.request_batch_size(16, confirm=True).ok
        one_step(model, optimizer)
        assert mon.request_batch_size(8, confirm=True).ok
        one_step(model, optimizer)
        assert mon.flush()
        first, second = mon.job.batch_control.changes
        assert first.verdict == "left before a verdict" and second.verdict is None


def test_a_change_the_job_ends_before_applying_is_said_in_the_record(bsmon_dir):
    from bsmon.probes.record.reader import open_record
    from bsmon.probes.wire.protocol import Event

    model, optimizer, mon = make_job(8, record=bsmon_dir / "run.jsonl")
    with mon:
        one_step(model, optimizer)
        assert mon.request_batch_size(16, confirm=True).ok  # for the next step, never taken
    events = [e for e in mon.job.telemetry.events if e.kind == "batch_size_unapplied"]
    assert [e.message for e in events] == [
        "the change to batch 16 (requested by the job) was never applied: the job ended at step 1, "
        "before the step boundary that would apply it; it trained at batch 8 to the end"
    ]
    with open_record(bsmon_dir / "run.jsonl") as reader:
        recorded = [line for line in reader.lines() if isinstance(line, Event)]
    assert any(e.kind == "batch_size_unapplied" for e in recorded)


def test_a_change_that_was_applied_leaves_nothing_to_say_at_the_end(bsmon_dir):
    model, optimizer, mon = make_job(8)
    with mon:
        assert mon.request_batch_size(16, confirm=True).ok
        one_step(model, optimizer)
    assert mon.job.batch_control.unapplied() is None
    assert not [e for e in mon.job.telemetry.events if e.kind == "batch_size_unapplied"]


# -- accumulation mode -----------------------------------------------------------------------


def test_accumulation_mode_changes_the_number_of_micro_batches(bsmon_dir):
    model, optimizer, mon = make_job(32, micro_batch_size=8)
    with mon:
        assert mon.accumulation_steps == 4 and mon.micro_batch_size == 8
        loader = mon.dataloader(IndexDataset(10_000))
        micro_per_step, current = [], 0
        for x, _ in loader:
            assert len(x) == 8
            (model(x).sum() / mon.accumulation_steps).backward()
            current += 1
            if mon.should_step():
                optimizer.step()
                optimizer.zero_grad()
                micro_per_step.append(current)
                current = 0
                if mon.step == 2:
                    assert mon.request_batch_size(64).ok
            if mon.step == 4:
                break
        # asked for after step 2, applied at the end of step 3 (the next step boundary)
        assert micro_per_step == [4, 4, 4, 8]
        assert mon.batch_size == 64 and mon.accumulation_steps == 8
        assert mon.flush() and mon.stats()["samples"] == 8 * (4 + 4 + 4 + 8)
        assert "not a multiple of the micro-batch size 8" in mon.request_batch_size(60).error


# -- the OOM guard -------------------------------------------------------------------------


def fake_oom(size: int) -> torch.OutOfMemoryError:
    return torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {size} MiB")


def test_an_oom_inside_the_guard_loses_no_sample_and_returns_to_the_last_good_size(bsmon_dir):
    model, optimizer, mon = make_job(16)
    limit = 40  # batches above this "run out of memory"
    trained = []
    with mon:
        loader = mon.dataloader(
            IndexDataset(500), shuffle=True, generator=torch.Generator().manual_seed(3)
        )
        for x, ids in loader:
            with mon.guard():
                if len(x) > limit:
                    raise fake_oom(len(x))
                model(x).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
                trained.extend(ids.tolist())
            if mon.step == 3 and mon.batch_size == 16:
                mon.request_batch_size(64, confirm=True)  # too big: the guard brings it back
        assert sorted(trained) == list(range(500))
        assert mon.batch_size == 16
        assert mon.flush()
        (oom,) = [e for e in mon.job.telemetry.events if e.kind == "oom"]
        assert (
            "out of memory at batch 64 (requested by the job); back to 16, the last size that ran; "
            "64 samples will run again"
        ) in oom.message
        assert "ran out of memory" in mon.request_batch_size(64).error  # now needs confirming


def test_the_guard_lets_other_errors_through_and_gives_up_at_the_smallest_size(bsmon_dir):
    _, _, mon = make_job(1)
    with mon:
        with pytest.raises(KeyError), mon.guard():
            raise KeyError("not memory")
        with pytest.raises(torch.OutOfMemoryError), mon.guard():
            raise fake_oom(1)  # nothing smaller than 1 to fall back to


def test_an_oom_in_accumulation_mode_halves_the_micro_batch(bsmon_dir):
    model, optimizer, mon = make_job(32, micro_batch_size=16)
    trained = []
    with mon:
        for x, ids in mon.dataloader(IndexDataset(96)):
            with mon.guard():
                if len(x) > 8:
                    raise fake_oom(len(x))
                model(x).sum().backward()
                trained.extend(ids.tolist())
                if mon.should_step():
                    optimizer.step()
                    optimizer.zero_grad()
        assert sorted(trained) == list(range(96))
        assert mon.batch_size == 32 and mon.micro_batch_size == 8 and mon.accumulation_steps == 4


# -- the loss after a change -----------------------------------------------------------------


def regression_steps(model, optimizer, mon, n: int, batch: int | None = None) -> None:
    """``n`` steps of noisy least squares (curvature 2: SGD diverges above lr 1), one metrics
    window each."""
    for _ in range(n):
        x = torch.randn(batch or mon.batch_size, 2)
        target = x.sum(1) + 0.1 * torch.randn(len(x))
        loss = (model(x).squeeze(1) - target).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        mon.log(loss=loss)
        mon.flush()


def test_a_loss_that_diverges_after_a_change_is_an_event_pointing_at_it(bsmon_dir):
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3)
    with attach(model, optimizer, batch_size=8) as mon:
        regression_steps(model, optimizer, mon, 30)
        assert mon.request_batch_size(64, confirm=True).ok  # linear rule: lr 0.3 → 2.4
        regression_steps(model, optimizer, mon, 1)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(2.4)

        def diverged():
            regression_steps(model, optimizer, mon, 1)
            return [e for e in mon.job.telemetry.events if e.kind == "loss_diverged"]

        (event,) = wait_until(diverged, message="a divergence event")
        change = mon.job.batch_control.changes[-1]
    assert event.level == "warning" and event.data["change_step"] == change.step
    assert f"after batch 8 → 64 at step {change.step}" in event.message
    assert "lr 0.3 → 2.4 (linear rule for SGD)" in event.message
    assert change.loss == "diverged"
    assert mon.job.batch_control.watch.trained_well == 8  # 64 did not train well


def test_a_loss_that_holds_makes_the_new_size_the_one_that_trained_well(bsmon_dir, monkeypatch):
    from bsmon.probes.batch import loss_watch

    monkeypatch.setattr(loss_watch, "WATCH_STEPS", 20)
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with attach(model, optimizer, batch_size=8) as mon:
        regression_steps(model, optimizer, mon, 30)
        wait_until(  # the process's memory read at this size (once a second): 32 is then
            lambda: (  # refused for the jump alone, not for fitting unmeasured
                regression_steps(model, optimizer, mon, 1),
                mon.job.batch_control.host_memory.points(),
            )[1],
            message="a memory reading at batch 8",
        )
        assert "4× the last batch size that trained well (8)" in mon.request_batch_size(32).error
        assert mon.request_batch_size(16, confirm=True).ok  # confirmed: no memory reading yet
        wait_until(
            lambda: (
                regression_steps(model, optimizer, mon, 1),
                mon.job.batch_control.changes[-1].loss,
            )[1],
            message="the loss watch's outcome",
        )
        assert mon.job.batch_control.changes[-1].loss == "held"
        assert mon.job.batch_control.watch.trained_well == 16
        assert "32 is 4×" not in (mon.request_batch_size(32).error or "")


def test_a_changes_progress_per_example_is_measured_from_the_loss_and_said_once(bsmon_dir):
    """A real job's loss, one metrics window a step: the change 8 → 16 is measured against
    8's own curve carried on, once the new size ran half the examples before it; the event
    and the change's reading say the same."""
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)  # a slow, steady fall
    with attach(model, optimizer, batch_size=8) as mon:
        regression_steps(model, optimizer, mon, 60)
        assert mon.request_batch_size(16, confirm=True).ok

        def measured():
            regression_steps(model, optimizer, mon, 1)
            return [e for e in mon.job.telemetry.events if e.kind == "batch_size_progress"]

        (event,) = wait_until(measured, message="the change's measurement")
        change = mon.job.batch_control.changes[-1]
    assert event.message.startswith("batch 8 → 16 made "), event.message
    assert "of 8's progress per example (from the loss, against 8's own curve" in event.message
    assert event.data["change_step"] == change.step
    assert change.efficiency == event.data["efficiency"]
    assert change.efficiency_low < change.efficiency < change.efficiency_high
    assert event.data["examples_after"] >= 0.5 * 60 * 8 - 16  # final: half the examples before
