"""The autopilot in a real training job: switched on over the socket, it grows the batch
once the noise scale resolves, with the learning rate following the rule for SGD; every
decision is an event in the record and the summary; a key press pauses it; a job whose
learning rate it cannot own is refused with the reason; `bsmon run --autopilot` switches it on
in a script that never imports bsmon, or says in one line why it cannot."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from bsmon.probes import attach
from bsmon.probes.batch.extension import AutopilotExtension
from bsmon.probes.wire import protocol
from bsmon.probes.wire.client import JobConnection

from ..helpers import ROOT, repeat_until
from ..watch import job_socket, kill_run_processes

MOST_STEPS = 20_000
RESIZABLE_JOB = str(ROOT / "tests" / "resizable_job.py")
GPT = str(ROOT / "tests" / "corpus" / "gpt.py")


def classification(seed: int = 0, n: int = 20_000) -> torch.utils.data.TensorDataset:
    """Ten noisy classes in 20 dimensions: a gradient noise scale in the hundreds."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 20, generator=generator)
    w = torch.randn(20, 10, generator=generator)
    y = (x @ w + 2.0 * torch.randn(n, 10, generator=generator)).argmax(1)
    return torch.utils.data.TensorDataset(x, y)


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 10))


def train_until(mon, model, optimizer, loader, done) -> None:
    """Train, 50 steps at a time, until ``done()``. An idle machine gets there within 600
    steps and a second or so; the agent ticks on its own clock, so a slow machine gets there
    in fewer steps and a fast one in more: fails only past ``MOST_STEPS`` and a minute."""
    batches = endless(loader)

    def fifty_steps() -> None:
        for x, y in itertools.islice(batches, 50):
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            mon.log(loss=loss)

    def said() -> str:
        reading = mon.job.autopilot_reading()
        return f"at step {mon.step}, batch {mon.batch_size}: {reading.waiting or reading.why}"

    repeat_until(fifty_steps, done, MOST_STEPS // 50, said)


def endless(loader):
    while True:
        yield from loader


def test_switched_on_over_the_socket_it_grows_the_batch_and_says_why(bsmon_dir):
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    mon = attach(model, optimizer, batch_size=8, max_batch_size=256, name="auto")
    record = mon.session.record
    loader = mon.dataloader(classification(), shuffle=True)
    with mon, JobConnection(mon.socket_path) as conn:
        hello = conn.hello()
        assert hello.capabilities["autopilot"].available
        assert hello.autopilot is not None and hello.autopilot.state == "off"
        reply = conn.request(protocol.AutopilotCommand(on=True))
        assert reply.ok, reply.error
        assert reply.result["state"] == "on" and reply.result["start_size"] == 8
        train_until(mon, model, optimizer, loader, lambda: mon.batch_size >= 16)
        reading = mon.job.autopilot_reading()
        first = reading.decisions[0]
        assert (first.old, first.new, first.kind) == (8, 16, "grow")
        assert first.b_simple_low > 0 and first.predicted_gain > 1.05
        # linear, for SGD (by the time the check comes round it may have grown again)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(0.02 * mon.batch_size / 8)
        assert mon.flush()  # the change's record reaches the agent
        change = mon.job.batch_control.changes[-1]
        assert change.source == "autopilot" and "linear rule for SGD" in change.lr_note
        # a key press from the monitor wins: the autopilot pauses, saying why
        reply = conn.request(protocol.StepBatchSize(direction="down", confirm=True))
        assert reply.ok, reply.error
        train_until(mon, model, optimizer, loader, lambda: mon.job.autopilot.state == "paused")
        assert "by monitor" in mon.job.autopilot_reading().why
        decided = len(mon.job.autopilot_reading().decisions)
        train_until(mon, model, optimizer, loader, lambda: mon.step > 200 + first.step)
        assert len(mon.job.autopilot_reading().decisions) == decided
        paused = conn.wait_matching(  # what a monitor is told, not only the job's object
            lambda m: isinstance(m, protocol.Metrics) and m.autopilot.state == "paused",
            "metrics with the autopilot paused",
            60.0,
        )
        assert "by monitor" in paused.autopilot.why
    lines = [json.loads(line) for line in Path(record).read_text("utf-8").splitlines()]
    decisions = [x for x in lines if x.get("type") == "event" and x["kind"] == "autopilot"]
    assert decisions and decisions[0]["data"]["decision"]["new"] == 16
    assert "vs batch 8" in decisions[0]["message"] or decisions[0]["data"]["claimed_gain"] is None
    summary = Path(record.removesuffix(".jsonl") + ".summary.md").read_text("utf-8")
    assert "## Autopilot" in summary and "8 → 16" in summary


def test_on_a_fast_loop_the_agent_ticks_by_steps_while_it_ramps_and_at_its_pace_once_held(
    bsmon_dir,
):
    """A step of a fraction of a millisecond: a tick of the agent's (a quarter second) is
    hundreds of steps, so while the autopilot ramps the agent ticks every few steps; at the
    policy's maximum it holds, and the agent is back at its own pace."""
    from bsmon.probes.runtime.inbox import TICK_S

    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    mon = attach(
        model, optimizer, batch_size=8, max_batch_size=16, autopilot=True, serve=False, name="pace"
    )
    service = mon._service
    periods = tick_periods_asked(service)
    loader = mon.dataloader(classification(), shuffle=True)
    with mon:
        # the periods the autopilot asked for, as each tick ended: reading service.tick_period
        # between steps races the tick, which resets it as it starts (on a loaded machine a
        # tick of the agent's can last most of its few milliseconds' period)
        train_until(mon, model, optimizer, loader, lambda: any(p < TICK_S for p in periods))
        train_until(mon, model, optimizer, loader, lambda: mon.batch_size == 16)
        train_until(mon, model, optimizer, loader, lambda: mon.job.autopilot.ramp_until == 0)
        assert "holding at 16" in mon.job.autopilot_reading().waiting
        train_until(mon, model, optimizer, loader, lambda: service.tick_period == TICK_S)


def tick_periods_asked(service) -> list[float]:
    """The tick periods the autopilot's extension asks for while it ramps (by its own rule:
    it asks for none once it holds)."""
    extension = next(e for e in service.extensions if isinstance(e, AutopilotExtension))
    periods, ask = [], extension.next_tick_s

    def asked() -> float | None:
        period = ask()
        if period is not None:
            periods.append(period)
        return period

    extension.next_tick_s = asked
    return periods


def train_epochs(mon, model, optimizer, loader, scheduler, *, per_step: bool, done, epochs: int):
    """Epochs with ``scheduler.step()`` after every step or at each epoch's end, until
    ``done()`` (checked every 25 steps and at each epoch's end) or fail after ``epochs``."""
    for _ in range(epochs):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if per_step:
                scheduler.step()
            if mon.step % 25 == 0 and done():
                return
        if not per_step:
            scheduler.step()
        if done():
            return
    pytest.fail(f"not done after {epochs} epochs (step {mon.step})")


def test_a_scheduler_stepped_every_step_refuses_it_with_the_reason(bsmon_dir):
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100)
    mon = attach(
        model, optimizer, batch_size=8, lr_scheduler=scheduler, autopilot=True, name="sched"
    )
    loader = mon.dataloader(classification(n=2_000), shuffle=True)
    with mon, JobConnection(mon.socket_path) as conn:
        refused = lambda: mon.job.autopilot.state == "refused"  # noqa: E731
        train_epochs(
            mon, model, optimizer, loader, scheduler, per_step=True, done=refused, epochs=200
        )
        reading = mon.job.autopilot_reading()
        assert "keyed on steps" in reading.why and "StepLR stepped" in reading.why
        assert mon.batch_size == 8 and reading.decisions == []
        assert mon.flush()
        warnings = [e for e in mon.job.telemetry.events if e.kind == "autopilot_state"]
        assert warnings and warnings[-1].level == "warning"
        reply = conn.request(protocol.AutopilotCommand(on=True))
        assert not reply.ok and "cannot steer this job" in reply.error


def test_a_scheduler_stepped_once_an_epoch_lets_it_grow_the_batch(bsmon_dir):
    """StepLR at each epoch's end (issue 43): a larger batch makes an epoch fewer steps and
    leaves the schedule in epochs as it was, so the autopilot steers."""
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
    mon = attach(
        model,
        optimizer,
        batch_size=8,
        max_batch_size=64,
        lr_scheduler=scheduler,
        autopilot=True,
        name="epochs",
    )
    # 2,500 steps an epoch at 8: on 4,000 examples (500 steps an epoch) the model fitted them
    # before B_simple resolved in 4 of 12 runs, and |G|² stayed within its noise for good
    loader = mon.dataloader(classification(n=20_000), shuffle=True)
    with mon:
        grown = lambda: mon.batch_size >= 16  # noqa: E731
        train_epochs(
            mon, model, optimizer, loader, scheduler, per_step=False, done=grown, epochs=12
        )
        reading = mon.job.autopilot_reading()
        assert reading.state == "on", reading.why
        assert (reading.decisions[0].old, reading.decisions[0].new) == (8, 16)
        epochs = scheduler.last_epoch
        # the scheduler's decay and the linear rule for SGD, both kept
        assert optimizer.param_groups[0]["lr"] == pytest.approx(
            0.02 * 0.9**epochs * mon.batch_size / 8
        )


def test_wrong_options_and_jobs_without_a_batch_size_are_told_why(bsmon_dir):
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for options, words in [
        ({"autopilot": True}, "autopilot=True needs batch_size"),
        ({"autopilot": "yes", "batch_size": 8}, "autopilot must be True or False"),
        ({"autopilot_half_batch": -1, "batch_size": 8}, "autopilot_half_batch must be"),
    ]:
        with pytest.raises(ValueError, match=words):
            attach(model, optimizer, **options)
    mon = attach(model, optimizer, name="nosize")
    with mon, JobConnection(mon.socket_path) as conn:
        assert mon.job.autopilot_reading() is None
        reply = conn.request(protocol.AutopilotCommand(on=True))
        assert not reply.ok and "declared no batch size" in reply.error


def test_bsmon_run_autopilot_switches_it_on_in_a_script_that_never_imports_bsmon(
    bsmon_dir, processes, tmp_path
):
    gate = tmp_path / "gate"
    command = [sys.executable, "-m", "bsmon.tui.cli", "run", "--autopilot", "--headless"]
    command += ["--name", "auto-run", "--", sys.executable, RESIZABLE_JOB, "--gate", str(gate)]
    run = processes.start(command, cwd=ROOT, text=True)
    try:
        with JobConnection(job_socket("auto-run", bsmon_dir)) as conn:
            hello = conn.hello()
            gate.touch()
        assert hello.autopilot is not None and hello.autopilot.state == "on"
        assert hello.autopilot.start_size == 8
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
    finally:
        kill_run_processes(bsmon_dir)
    assert out.rstrip().endswith("done")


def test_bsmon_run_autopilot_on_a_script_that_cuts_its_own_batches_says_why_not(
    bsmon_dir, processes
):
    command = [sys.executable, "-m", "bsmon.tui.cli", "run", "--autopilot", "--headless"]
    command += ["--name", "auto-gpt", "--", sys.executable, GPT, "--steps", "400"]
    run = processes.start(command, cwd=ROOT, text=True)
    try:
        with JobConnection(job_socket("auto-gpt", bsmon_dir)) as conn:
            capability = conn.hello().capabilities["autopilot"]
            attached = conn.wait_matching(
                lambda m: isinstance(m, protocol.Event) and m.kind == "zero_code",
                "the attach note",
                60.0,
            )
        run.kill()
    finally:
        kill_run_processes(bsmon_dir)
    assert not capability.available and "cuts its own batches" in capability.reason
    assert "so is the autopilot (--autopilot)" in attached.message
