"""The probe from the dashboard: p asks first, then runs; the probe screen shows the points
and applies the recommendation with a key."""

from __future__ import annotations

from textual.widgets import DataTable

from bsmon.probes.wire import protocol
from bsmon.tui.app import BsmonApp
from bsmon.tui.confirm import ConfirmScreen
from bsmon.tui.probe_screen import ProbeScreen
from bsmon.tui.sources import ScriptedSource

from ..scripted import NOW, messages, probed_messages
from .test_tui_pilot import dashboard_ready, wait_for


def answer_all(command: protocol.Command) -> protocol.Reply:
    return protocol.Reply(id=command.id, ok=True, result={"started": True})


async def test_p_asks_first_then_starts_the_probe_and_opens_its_screen():
    script = messages()
    script[0].capabilities["probe"] = protocol.Capability(True)
    source = ScriptedSource("job", script, clock=lambda: NOW, reply=answer_all)
    app = BsmonApp(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await dashboard_ready(pilot)
        await pilot.press("p")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="question")
        assert "job keeps training, but slows" in app.screen.question
        assert "never reaches the job" in app.screen.question
        await pilot.press("y")
        await wait_for(pilot, lambda: isinstance(app.screen, ProbeScreen), what="probe screen")
        await wait_for(pilot, lambda: source.sent, what="the probe command")
    assert isinstance(source.sent[0], protocol.ProbeCommand)


async def test_the_probe_screen_shows_points_and_applies_the_recommendation():
    script = probed_messages()
    script[0].capabilities["probe"] = protocol.Capability(True)
    source = ScriptedSource("job", script, clock=lambda: NOW, reply=answer_all)
    app = BsmonApp(source)
    async with app.run_test(size=(120, 40)) as pilot:
        dashboard = await dashboard_ready(pilot)
        dashboard.open_probe_screen()
        await pilot.pause(0.2)
        screen = app.screen
        assert isinstance(screen, ProbeScreen)
        table = screen.query_one("#points", DataTable)
        assert table.row_count == 4  # three sizes and the confirmation
        findings = str(screen.query_one("#findings").render())
        assert "largest batch that ran: 263" in findings and "≈263" in findings
        assert "a prediction" in findings and "recommended batch: 192" in findings
        assert "confirmed: a full step at 263 ran within the budget" in findings
        assert "bf16 autocast: ≈448 (predicted) — peak 31 GiB at 230" in findings
        await pilot.press("a")
        await wait_for(pilot, lambda: source.sent, what="the apply command")
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, ProbeScreen), what="back")
    command = source.sent[0]
    assert isinstance(command, protocol.SetBatchSize) and command.value == 192


async def test_readonly_hides_the_probe_key():
    script = messages()
    script[0].capabilities["probe"] = protocol.Capability(True)
    source = ScriptedSource("job", script, clock=lambda: NOW, reply=answer_all)
    app = BsmonApp(source, readonly=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await dashboard_ready(pilot)
        await pilot.press("p")
        await pilot.pause(0.3)
        assert not isinstance(app.screen, ConfirmScreen)
    assert source.sent == []


def test_probe_screen_snapshot(snap_compare):
    async def open_probe(pilot):
        dashboard = await dashboard_ready(pilot)
        dashboard.open_probe_screen()
        await pilot.pause(0.3)

    source = ScriptedSource("job", probed_messages(), clock=lambda: NOW)
    assert snap_compare(BsmonApp(source), terminal_size=(120, 40), run_before=open_probe)


async def test_a_recommendation_equal_to_the_jobs_size_says_stay_and_a_does_nothing():
    script = probed_messages()
    result = script[-1].probe.result
    result.recommendation.current = result.recommendation.batch_size  # the job runs at 192
    result.budget_note = "25% of the 24.0 GiB available, capped at 1 GiB"
    result.notes = ["the sidecar ran on the CPU cores the job was using"]
    source = ScriptedSource("job", script, clock=lambda: NOW, reply=answer_all)
    app = BsmonApp(source)
    async with app.run_test(size=(120, 40)) as pilot:
        dashboard = await dashboard_ready(pilot)
        dashboard.open_probe_screen()
        await wait_for(
            pilot,
            lambda: isinstance(app.screen, ProbeScreen) and app.screen.query("#findings"),
            what="probe screen",
        )
        await pilot.pause(0.2)
        findings = str(app.screen.query_one("#findings").render())
        assert "recommended: stay at 192" in findings and "press a" not in findings
        assert "25% of the 24.0 GiB available, capped at 1 GiB" in findings
        assert "note: the sidecar ran on the CPU cores the job was using" in findings
        await pilot.press("a")
        await pilot.pause(0.2)
    assert source.sent == []
