"""Batch-size keys in the dashboard: Pilot against a real job, confirmations, --readonly."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from bsmon.probes import attach
from bsmon.probes.wire import protocol
from bsmon.tui.app import BsmonApp, follow_job
from bsmon.tui.commands import CommandDesk
from bsmon.tui.confirm import ConfirmScreen
from bsmon.tui.sources import ScriptedSource

from ..jobs import TinyJob
from ..scripted import CPU_MFU_NOTE, NOW, messages, with_throughput
from .test_tui_pilot import dashboard_ready, text_of, wait_for


@contextlib.asynccontextmanager
async def dashboard_on_a_real_job(bsmon_dir, name: str):
    """A real job at batch 8 and a dashboard following it, once its hello is in; the job's
    monitor is closed afterwards, whatever the test did."""
    job = TinyJob(batch_size=8)
    mon = attach(job.model, job.optimizer, batch_size=8, name=name)
    app = BsmonApp(follow_job(mon.socket_path, name, bsmon_dir))
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            screen = await dashboard_ready(pilot)
            await wait_for(pilot, lambda: screen.snapshot.can("step_batch_size"), what="hello")
            yield job, mon, app, pilot
    finally:
        mon.close()


def footer_keys(app) -> set[str]:
    return {
        binding.id
        for (_, binding, enabled, _) in app.active_bindings.values()
        if binding.id and enabled
    }


async def test_plus_and_minus_change_a_real_jobs_batch_size(bsmon_dir):
    async with dashboard_on_a_real_job(bsmon_dir, "keys") as (job, mon, app, pilot):
        assert {"batch_up", "batch_down"} <= footer_keys(app)
        job.step(mon)  # a step at 8, then a memory reading: 16 is measured to fit
        await wait_for(pilot, mon.job.batch_control.host_memory.points, what="memory reading")
        await pilot.press("plus")
        await wait_for(pilot, lambda: mon.job.batch_control.pending is not None, what="request")
        job.step(mon)  # the step boundary applies it
        assert mon.batch_size == 16
        await asyncio.to_thread(mon.flush)
        await wait_for(
            pilot,
            lambda: "16" in text_of(app, "#batch") and "8→16" in text_of(app, "#batch"),
            what="panel shows 8→16",
        )
        await pilot.press("minus")
        await wait_for(pilot, lambda: mon.job.batch_control.pending is not None, what="request")
        job.step(mon)
        assert mon.batch_size == 8


async def test_a_jump_past_twice_the_size_that_trained_well_asks_with_the_jobs_reason(
    bsmon_dir,
):
    async with dashboard_on_a_real_job(bsmon_dir, "risky") as (job, mon, app, pilot):
        job.step(mon)
        await wait_for(pilot, mon.job.batch_control.host_memory.points, what="memory reading")
        await pilot.press("plus")  # 16: twice the size that trained well, measured to fit
        await wait_for(pilot, lambda: mon.job.batch_control.pending is not None, what="16")
        await pilot.press("plus")  # 32: four times 8, which alone has trained well
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="question")
        question = app.screen.question
        assert "32 is 4× the last batch size that trained well (8)" in question
        assert mon.job.batch_control.pending.value == 16  # nothing applied while it asks
        await pilot.press("y")
        await wait_for(pilot, lambda: mon.job.batch_control.pending.value == 32, what="32")
        job.step(mon)
        assert mon.batch_size == 32


async def test_the_panel_says_each_changes_verdict_and_a_diverged_or_recovered_loss():
    script = messages()

    def change(step: int, old: int, new: int, reason: str, verdict: str, **loss: str):
        return protocol.BatchChange(
            step=step,
            t=NOW,
            old=old,
            new=new,
            reason=reason,
            source="monitor",
            verdict=verdict,
            **loss,
        )

    changes = [
        change(100, 64, 32, "step down", "left before a verdict"),
        change(200, 32, 1, "set", "no measurable difference", loss="diverged"),
        change(
            8968, 128, 262, "the probe's recommendation", "left before a verdict", loss="recovered"
        ),
    ]
    for message in script:
        if isinstance(message, protocol.Metrics):
            message.batch.changes = changes
    panel = await batch_panel(script, (120, 40), "32→1")
    assert "64→32  left before a verdict" in panel
    assert "32→1  loss diverged · no measurable difference" in panel
    assert "128→262  recovered · left before a verdict" in panel  # no stale alarm
    assert panel.count("loss diverged") == 1


async def batch_panel(script: list[protocol.Message], size: tuple[int, int], once: str) -> str:
    """The Batch panel's text once ``once`` is in it, the ``script`` replayed at ``size``."""
    app = BsmonApp(ScriptedSource("job", script, clock=lambda: NOW))
    async with app.run_test(size=size) as pilot:
        await dashboard_ready(pilot)
        await wait_for(pilot, lambda: once in text_of(app, "#batch"), what=once)
        return text_of(app, "#batch")


def confirming_reply(command: protocol.Command) -> protocol.Reply:
    if isinstance(command, protocol.StepBatchSize):
        return protocol.Reply(
            id=command.id,
            ok=False,
            error="step_batch_size: too big; send again with confirm",
            result={
                "needs_confirmation": True,
                "value": 256,
                "why": "the memory model predicts 95% of memory",
            },
        )
    assert isinstance(command, protocol.SetBatchSize) and command.confirm
    return protocol.Reply(
        id=command.id,
        ok=True,
        result={"old": 128, "new": 256, "step": 3000, "applies_after_step": 3001},
    )


@pytest.mark.parametrize(("answer", "commands_sent"), [("y", 2), ("n", 1)])
async def test_a_risky_step_asks_first_and_sends_the_confirmed_size_only_on_yes(
    answer, commands_sent
):
    source = ScriptedSource("job", messages(), clock=lambda: NOW, reply=confirming_reply)
    app = BsmonApp(source)
    async with app.run_test(size=(100, 30)) as pilot:
        await dashboard_ready(pilot)
        await pilot.press("plus")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="question")
        assert "predicts 95% of memory" in app.screen.question
        await pilot.press(answer)
        await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmScreen), what="answer")
        await wait_for(pilot, lambda: len(source.sent) >= commands_sent, what="commands")
        await pilot.pause(0.2)
    assert len(source.sent) == commands_sent
    first = source.sent[0]
    assert isinstance(first, protocol.StepBatchSize) and first.direction == "up"
    if answer == "y":
        second = source.sent[1]
        assert isinstance(second, protocol.SetBatchSize) and second.value == 256
        assert second.confirm


async def test_readonly_removes_the_keys_and_sends_nothing():
    source = ScriptedSource("job", messages(), clock=lambda: NOW, reply=confirming_reply)
    app = BsmonApp(source, readonly=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await dashboard_ready(pilot)
        assert not {"batch_up", "batch_down"} & footer_keys(app)
        await pilot.press("plus", "minus")
        await pilot.pause(0.3)
    assert source.sent == []


async def test_keys_are_disabled_when_the_job_cannot_change_its_batch():
    script = messages()
    script[0].capabilities["step_batch_size"] = protocol.Capability(False, "no batch size")
    source = ScriptedSource("job", script, clock=lambda: NOW)
    app = BsmonApp(source)
    async with app.run_test(size=(100, 30)) as pilot:
        await dashboard_ready(pilot)
        assert not {"batch_up", "batch_down"} & footer_keys(app)
        await pilot.press("plus")
        await pilot.pause(0.3)
    assert source.sent == []


@pytest.mark.parametrize(
    ("error", "toast"),
    [
        (
            "step_batch_size: 1 is already the smallest batch size the policy allows",
            "1 is already the smallest batch size the policy allows",
        ),
        ("set_batch_size: the batch size is already 64", "the batch size is already 64"),
        (
            "probe: the probe needs attach(..., loss_fn=...)",
            "the probe needs attach(..., loss_fn=...)",
        ),
        ("the connection is read-only", "the connection is read-only"),
    ],
)
def test_refusals_are_told_without_the_commands_wire_name(error, toast):
    desk = CommandDesk(ScriptedSource("job", []), readonly=False)
    sent = desk.send(protocol.StepBatchSize(direction="down"))
    outcome = desk.answer(protocol.Reply(id=sent, ok=False, error=error))
    assert outcome is not None and outcome.kind == "refused" and outcome.message == toast
    unsent = desk.answer(protocol.Reply(id="other", ok=False, error=error))
    assert unsent is not None and unsent.message == toast


async def test_a_switches_the_autopilot_on_a_key_press_pauses_it_and_a_again_resumes(bsmon_dir):
    async with dashboard_on_a_real_job(bsmon_dir, "auto-keys") as (job, mon, app, pilot):
        assert "autopilot" in footer_keys(app)
        await pilot.press("a")
        await wait_for(pilot, lambda: mon.job.autopilot.state == "on", what="autopilot on")
        job.step(mon)  # a step: a metrics message carries the autopilot's reading
        await wait_for(pilot, lambda: "auto    on" in text_of(app, "#batch"), what="on")
        job.step(mon)
        await wait_for(pilot, mon.job.batch_control.host_memory.points, what="memory reading")
        await pilot.press("minus")  # the user's key wins
        await wait_for(pilot, lambda: mon.job.batch_control.pending is not None, what="request")
        job.step(mon)
        await asyncio.to_thread(mon.flush)
        await wait_for(pilot, lambda: mon.job.autopilot.state == "paused", what="paused")
        job.step(mon)
        await wait_for(pilot, lambda: "auto    paused" in text_of(app, "#batch"), what="shown")
        await pilot.press("a")  # on again, from the size the user chose
        await wait_for(pilot, lambda: mon.job.autopilot.state == "on", what="on again")


def test_the_autopilot_lines_fit_the_batch_panel_at_80_columns():
    """The Batch panel is 32 columns inside at 80×24: with the demo's sizes, an assumed B½ and
    a six-figure step of the next look fit on the second line ('~' says assumed, the help
    says so; 'B½ 64 assumed · next s7,797' wrapped its step onto a line of its own). Sizes of
    four figures wrap the first line at a space."""
    import msgspec
    from rich.text import Text

    from bsmon.tui.widgets.batch import autopilot_lines

    from ..scripted import autopilot_reading

    reading = msgspec.structs.replace(
        autopilot_reading(),
        half_batch=64.0,
        half_batch_how="assumed equal to the one size measured",
        next_decision_step=123_456,
        claimed_gain=2.46,
        start_size=64,
        target=512,
        held="holds: 1.049× < 1.05×",  # the agent's words (issue 41), shown as they come
    )
    lines = [Text.from_markup(line.replace("$", "")).plain for line in autopilot_lines(reading)]
    assert lines[1].strip() == "B½ ~64 · next s123,456"
    assert lines[2].strip() == "holds: 1.049× < 1.05×"
    assert all(len(line) <= 32 for line in lines), lines


async def test_the_panel_shows_tokens_per_second_and_mfu_where_the_job_has_them():
    reading = protocol.ThroughputReading(tokens_per_s=1_052_000.0, mfu=0.412)
    script = with_throughput(messages(), reading)
    panel = await batch_panel(script, (80, 24), "tok/s")  # one line at 80 columns
    assert "tokens  1.05M tok/s · MFU 41.2%" in panel
    assert "n/a" not in panel.split("tok/s")[1].split("seen")[0]


async def test_a_sequence_model_on_a_cpu_shows_why_it_has_no_mfu():
    """Tokens without MFU: the agent's reason under them, as the memory line gives its own."""
    reading = protocol.ThroughputReading(tokens_per_s=48_300.0, mfu_note=CPU_MFU_NOTE)
    panel = await batch_panel(with_throughput(messages(gpu=False), reading), (120, 40), "tok/s")
    assert "tokens  48.3k tok/s\n" in panel
    assert "MFU     n/a: the model runs on the CPU (no peak FLOP/s)" in panel


def test_a_job_without_tokens_or_mfu_shows_neither_and_mfu_alone_shows_alone():
    from bsmon.tui.widgets.batch import mfu_note_line, throughput_line

    cpu = protocol.ThroughputReading(tokens_note="not token ids", mfu_note="MFU n/a: the CPU")
    assert throughput_line(None) is None and throughput_line(cpu) is None
    assert throughput_line(protocol.ThroughputReading(mfu=0.05)) == "MFU     5.0%"
    assert mfu_note_line(cpu) is None  # no tokens: the model is not one MFU is shown for
