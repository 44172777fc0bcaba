"""The probe from the dashboard: p asks first, then runs; the probe screen shows the points
and applies the recommendation with a key."""

from __future__ import annotations

import pytest
from textual.containers import VerticalScroll
from textual.widgets import Button, DataTable, Footer, Static

from bsmon.probes.wire import protocol
from bsmon.tui.app import BsmonApp
from bsmon.tui.confirm import ConfirmScreen
from bsmon.tui.probe_screen import ProbeScreen
from bsmon.tui.sources import ScriptedSource

from ..scripted import NOW, messages, probed_messages
from .test_tui_pilot import dashboard_ready, wait_for

FIRST_REASON = "goodput: 192 predicts 1.07× the progress per second of 128"


def answer_all(command: protocol.Command) -> protocol.Reply:
    return protocol.Reply(id=command.id, ok=True, result={"started": True})


def probe_job(script: list[protocol.Message]) -> tuple[ScriptedSource, BsmonApp]:
    """The dashboard on a scripted job that offers the probe and accepts every command."""
    script[0].capabilities["probe"] = protocol.Capability(True)
    source = ScriptedSource("job", script, clock=lambda: NOW, reply=answer_all)
    return source, BsmonApp(source)


async def ask_to_probe(pilot) -> ConfirmScreen:
    """``p`` on the dashboard, and the question it asks."""
    app = pilot.app
    await dashboard_ready(pilot)
    await pilot.press("p")
    await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="question")
    return app.screen


async def open_probe(pilot) -> None:
    """The probe screen, drawn from the finished probe's reading (the last message)."""
    dashboard = await dashboard_ready(pilot)
    await wait_for(
        pilot,
        lambda: (reading := dashboard._probe_reading()) is not None and reading.result is not None,
        what="the finished probe's reading",
    )
    dashboard.open_probe_screen()
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, ProbeScreen), what="probe screen")
    await settled(pilot)


async def settled(pilot) -> None:
    """Until a refresh changes nothing on the screen: the status lines' heights settle after
    the first layout, and the charts' ticks follow the rows they are given."""
    last = None
    for _ in range(50):
        await pilot.pause()
        drawn = pilot.app.export_screenshot()
        if drawn == last:
            return
        last = drawn


async def test_p_asks_first_then_starts_the_probe_and_opens_its_screen():
    source, app = probe_job(messages())
    async with app.run_test(size=(120, 40)) as pilot:
        question = await ask_to_probe(pilot)
        assert "job keeps training, but slows" in question.question
        assert "never reaches the job" in question.question
        await pilot.press("y")
        await wait_for(pilot, lambda: isinstance(app.screen, ProbeScreen), what="probe screen")
        await wait_for(pilot, lambda: source.sent, what="the probe command")
    assert isinstance(source.sent[0], protocol.ProbeCommand)


async def test_the_probe_screen_shows_points_and_applies_the_recommendation():
    source, app = probe_job(probed_messages())
    async with app.run_test(size=(120, 40)) as pilot:
        await open_probe(pilot)
        screen = app.screen
        assert isinstance(screen, ProbeScreen)
        table = screen.query_one("#points", DataTable)
        assert table.row_count == 4  # three sizes and the confirmation
        findings = str(screen.query_one("#findings").render())
        assert "largest batch that ran: 263" in findings and "≈263" in findings
        assert "a prediction" in findings
        assert "recommended batch: 192" in str(screen.query_one("#recommendation").render())
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
        recommendation = str(app.screen.query_one("#recommendation").render())
        assert "recommended: stay at 192" in recommendation and "press a" not in recommendation
        assert "25% of the 24.0 GiB available, capped at 1 GiB" in findings
        assert "note: the sidecar ran on the CPU cores the job was using" in findings
        await pilot.press("a")
        await pilot.pause(0.2)
    assert source.sent == []


def holder_of(screen, text: str) -> Static:
    """The Static whose text holds ``text`` (the recommendation's line or reason)."""
    return next(w for w in screen.query(Static) if text in str(w.render()))


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=lambda s: f"{s[0]}x{s[1]}")
async def test_the_recommendation_and_its_first_reason_are_in_view_without_scrolling(size):
    app = BsmonApp(ScriptedSource("job", probed_messages(), clock=lambda: NOW))
    async with app.run_test(size=size) as pilot:
        dashboard = await dashboard_ready(pilot)
        dashboard.open_probe_screen()
        await wait_for(pilot, lambda: isinstance(app.screen, ProbeScreen), what="probe screen")
        screen = app.screen
        await pilot.pause(0.3)
        footer_top = screen.query_one(Footer).region.y
        for text in ("recommended batch: 192 — press a to apply", FIRST_REASON):
            holder = holder_of(screen, text)
            visible = screen.find_widget(holder).visible_region
            assert visible == holder.region and holder.region.bottom <= footer_top, text
        # the rest scrolls, from the keyboard: the panel has the focus
        rest = screen.query_one("#probe-left", VerticalScroll)
        assert screen.focused is rest
        if rest.max_scroll_y:
            await pilot.press("end")
            await wait_for(pilot, lambda: rest.scroll_y == rest.max_scroll_y, what="scrolled")
        assert "memory: up to 263 (the probe)" in str(screen.query_one("#findings").render())


async def test_p_after_a_finished_probe_offers_its_last_result_without_probing():
    source, app = probe_job(probed_messages())
    async with app.run_test(size=(80, 24)) as pilot:
        question = await ask_to_probe(pilot)
        assert "l shows its result again" in question.question
        button = question.query_one("#other", Button)
        assert "Last result (l)" in str(button.label)
        assert button.region.right <= 80 and button.region.width  # on screen at 80 columns
        await pilot.press("l")
        await wait_for(pilot, lambda: isinstance(app.screen, ProbeScreen), what="probe screen")
        await pilot.pause(0.2)
        assert "recommended batch: 192" in str(app.screen.query_one("#recommendation").render())
    assert source.sent == []  # no new probe


async def test_the_palette_reopens_the_last_result_even_read_only():
    source = ScriptedSource("job", probed_messages(), clock=lambda: NOW, reply=answer_all)
    app = BsmonApp(source, readonly=True)
    async with app.run_test(size=(80, 24)) as pilot:
        dashboard = await dashboard_ready(pilot)
        dashboard.run_or_explain("probe_result")
        await wait_for(pilot, lambda: isinstance(app.screen, ProbeScreen), what="probe screen")
        await wait_for(pilot, lambda: app.screen.query("#recommendation"), what="its findings")
        await pilot.pause(0.2)
        assert "recommended batch: 192" in str(app.screen.query_one("#recommendation").render())
    assert source.sent == []


async def test_the_palette_says_when_no_probe_has_run_yet():
    _, app = probe_job(messages())
    async with app.run_test(size=(80, 24)) as pilot:
        dashboard = await dashboard_ready(pilot)
        dashboard.run_or_explain("probe_result")
        toasts = lambda: [n.message for n in app._notifications]  # noqa: E731
        await wait_for(pilot, lambda: "no probe has run yet" in toasts(), what="the toast")
        assert app.screen is dashboard


async def test_p_before_any_probe_has_finished_asks_only_yes_or_no():
    _, app = probe_job(messages())
    async with app.run_test(size=(80, 24)) as pilot:
        question = await ask_to_probe(pilot)
        assert not question.query("#other") and "result again" not in question.question
