"""What the dashboard says about batch control under `bsmon run` and the integrations: why
+/- are off, and where a held change applies."""

from __future__ import annotations

from bsmon.probes.launch.autoattach import CONTROL_REASON, PROBE_REASON
from bsmon.probes.wire import protocol
from bsmon.tui.app import BsmonApp
from bsmon.tui.commands import describe_success
from bsmon.tui.settings import settings
from bsmon.tui.sources import ScriptedSource
from bsmon.tui.widgets.batch import size_line
from bsmon.tui.widgets.charts import ScalarChart

from ..scripted import NOW, messages
from .test_tui_pilot import dashboard_ready, text_of, wait_for

REASON = CONTROL_REASON
SAMPLES_NOTE = "samples not counted: no DataLoader batch was seen"


def zero_code_script() -> list[protocol.Message]:
    """A bsmon run job: no batch control, no probe, samples not counted."""
    script = messages()
    for kind in ("set_batch_size", "step_batch_size", "autopilot"):
        script[0].capabilities[kind] = protocol.Capability(False, REASON)
    script[0].capabilities["probe"] = protocol.Capability(False, PROBE_REASON)
    for message in script:
        if isinstance(message, protocol.Metrics):
            message.batch = protocol.BatchReading()  # no control in this job
            message.samples, message.samples_per_s = None, None
            message.samples_note = SAMPLES_NOTE
    return script


async def test_the_batch_panel_says_why_the_keys_are_off_and_samples_are_not_counted():
    app = BsmonApp(ScriptedSource("job", zero_code_script(), clock=lambda: NOW))
    async with app.run_test(size=(120, 40)) as pilot:
        await dashboard_ready(pilot)
        await wait_for(pilot, lambda: "+/- p a off" in text_of(app, "#batch"), what="keys off")
        text = " ".join(text_of(app, "#batch").split())
        assert "+/- p a off — ? says why" in text
        assert "speed n/a (samples not counted: see Events)" in text
        assert "seen n/a samples" in text and "0 samples" not in text
        await pilot.press("question_mark")
        await pilot.pause()
        help_text = app.screen.text()
        assert f"`+/-` is off: {REASON}." in help_text
        assert f"`p` is off: {PROBE_REASON}." in help_text


def test_a_held_change_says_where_it_applies():
    metrics = next(m for m in messages() if isinstance(m, protocol.Metrics))
    metrics.batch = protocol.BatchReading(
        control=True, pending=256, applies_at="at the end of the epoch"
    )
    assert "→ 256 at the end of the epoch" in size_line(metrics)
    metrics.batch = protocol.BatchReading(control=True, pending=256)
    assert "→ 256 at the next step" in size_line(metrics)
    command = protocol.SetBatchSize(value=256)
    held = {"old": 128, "new": 256, "applies_at": "at the end of the epoch"}
    reply = protocol.Reply(id=1, ok=True, result=held)  # as the job sends it
    result = protocol.BatchSizeResult.of(reply)
    assert describe_success(command, result) == "batch size 128 → 256 at the end of the epoch"
    now = protocol.BatchSizeResult(old=128, new=256, applies_after_step=7)
    assert describe_success(command, now) == "batch size 128 → 256 after step 7"


async def test_an_empty_loss_chart_under_bsmon_run_names_backward_not_mon_log(monkeypatch):
    script = [m for m in zero_code_script() if not isinstance(m, protocol.Metrics)]
    script = [m for m in script if not isinstance(m, protocol.History)]  # no loss yet
    script[0].session.zero_code = True  # as bsmon run's agent says in its hello
    app = BsmonApp(ScriptedSource("job", script, clock=lambda: NOW))
    async with app.run_test(size=(120, 40)) as pilot:
        await dashboard_ready(pilot)
        await wait_for(pilot, lambda: "backward()" in text_of(app, "#scalars"), what="hint")
        assert "mon.log" not in text_of(app, "#scalars")

    monkeypatch.setattr(settings, "mode", "run")  # bsmon run, before the job says hello
    app = BsmonApp(ScriptedSource("job", [], clock=lambda: NOW))
    async with app.run_test(size=(80, 24)) as pilot:
        await dashboard_ready(pilot)
        hint = ScalarChart.zero_code_hint
        await wait_for(pilot, lambda: hint in text_of(app, "#scalars"), what="whole hint")


async def test_an_empty_loss_chart_of_an_attached_job_says_mon_log():
    script = [m for m in messages() if not isinstance(m, protocol.Metrics | protocol.History)]
    app = BsmonApp(ScriptedSource("job", script, clock=lambda: NOW))
    async with app.run_test(size=(120, 40)) as pilot:
        await dashboard_ready(pilot)
        await wait_for(pilot, lambda: "mon.log(loss=loss)" in text_of(app, "#scalars"), what="hint")


def test_a_size_that_varies_is_shown_as_the_agent_says():
    metrics = next(m for m in messages() if isinstance(m, protocol.Metrics))
    metrics.batch_size, metrics.batch_varies = 31, "varies 10–500 per step"
    assert size_line(metrics) == "[b]31[/b] [$text-muted](varies 10–500 per step)[/]"
