"""bsmon's own actions in the command palette: found by name, and run as their keys do."""

from __future__ import annotations

from textual.command import CommandPalette
from textual.widgets import OptionList

from bsmon.probes.wire.protocol import AutopilotCommand
from bsmon.tui.anatomy_screen import AnatomyScreen
from bsmon.tui.confirm import ConfirmScreen
from bsmon.tui.disabled import DETACH_OFF
from bsmon.tui.palette import COMMANDS, dashboard_commands
from bsmon.tui.settings import DETACH, settings

from ..scripted import scripted_app
from .test_tui_keys_off import toasts
from .test_tui_pilot import dashboard_ready, wait_for


def prompts(app) -> list[str]:
    options = app.screen.query_one(OptionList)
    return [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]


async def search(pilot, words: str) -> list[str]:
    app = pilot.app
    await pilot.press("ctrl+p")
    await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette), what="palette")
    await pilot.press(*words)
    first = words.split(maxsplit=1)[0]
    await wait_for(pilot, lambda: any(first in p.lower() for p in prompts(app)), what=words)
    return prompts(app)


async def test_the_palette_finds_probe_export_time_ranks_and_the_interval():
    app = scripted_app()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await dashboard_ready(pilot)
        titles = [command.title for command in dashboard_commands(screen)]
        for needed in (
            "Probe",
            "Export",
            "Step anatomy",
            "Ranks",
            "Batch size up",
            "Refresh",
            "Autopilot",
            "Jobs",
            "Detach",
        ):
            assert any(needed in title for title in titles), needed
        found = await search(pilot, "probe")
        assert any("Probe the largest batch size" in p for p in found)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="probe asks")
        await pilot.press("n")
        await wait_for(pilot, lambda: app.screen is screen, what="back")
        await search(pilot, "anatomy")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, AnatomyScreen), what="time view")


async def test_a_palette_action_the_job_cannot_serve_says_why(monkeypatch):
    monkeypatch.setattr(settings, "interval_s", settings.interval_s)  # restored after
    app = scripted_app()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await dashboard_ready(pilot)
        ranks = next(c for c in COMMANDS if c[2] == "ranks")
        screen.run_or_explain(ranks[2], *ranks[3])
        await wait_for(
            pilot,
            lambda: any("r is off" in str(n.message) for n in app._notifications),
            what="why",
        )
        interval = screen.interval
        screen.run_or_explain("interval", 1)
        assert screen.interval > interval


async def test_the_palette_finds_the_autopilot_and_runs_it_as_a_does():
    app = scripted_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await dashboard_ready(pilot)
        found = await search(pilot, "autopilot")
        assert any("Autopilot on / off" in p for p in found)
        await pilot.press("enter")
        sent = app.source.sent
        await wait_for(pilot, lambda: any(isinstance(c, AutopilotCommand) for c in sent), what="a")
        assert next(c for c in sent if isinstance(c, AutopilotCommand)).on is True


async def test_under_bsmon_run_the_palette_detaches_and_its_quit_says_it_stops_the_job(
    monkeypatch,
):
    monkeypatch.setattr(settings, "mode", "run")
    app = scripted_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await dashboard_ready(pilot)
        found = await search(pilot, "quit")
        assert any("Stop the job" in p for p in found), found
        await pilot.press("escape")
        await search(pilot, "detach")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.return_value == DETACH, what="detached")


async def test_detach_outside_bsmon_run_says_why_from_the_palette_and_the_key(monkeypatch):
    monkeypatch.setattr(settings, "mode", "demo")
    app = scripted_app()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await dashboard_ready(pilot)
        screen.run_or_explain("detach")
        await wait_for(pilot, lambda: any(DETACH_OFF["demo"] in t for t in toasts(app)), what="why")
        app.clear_notifications()
        await pilot.press("d")
        await wait_for(pilot, lambda: any("d is off" in t for t in toasts(app)), what="d says why")
        assert app.return_value is None and app.screen is screen
        found = await search(pilot, "quit")
        assert any("Quit and stop the demo job" in p for p in found), found
