"""The dashboard's layout at the sizes people use: Events readable, `l` expands it."""

from __future__ import annotations

import pytest

from bsmon.tui.widgets import Panel
from bsmon.tui.widgets.eventlog import EventLog

from ..scripted import scripted_app
from .test_tui_pilot import dashboard_ready, wait_for


def event_text(log: EventLog) -> str:
    return " ".join(" ".join(line.text for line in log.lines).split())


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=lambda s: f"{s[0]}x{s[1]}")
async def test_events_keep_readable_rows_and_wrap_inside_the_panel(size):
    app = scripted_app()
    async with app.run_test(size=size) as pilot:
        await dashboard_ready(pilot)
        log = app.screen.query_one(EventLog)
        await wait_for(pilot, lambda: len(log.lines) >= 2, what="events")
        await pilot.pause(0.2)
        assert log.scrollable_content_region.height >= 4  # was 2 rows at every size
        width = log.scrollable_content_region.width
        assert all(line.cell_length <= width for line in log.lines)  # none under the scrollbar
        assert "grad_norm is inf at step 1600 (shown as a gap in the chart)" in event_text(log)
        assert app.screen.active_bindings["l"].binding.description == "Events"
        shown = {
            key.description: key.region
            for key in app.screen.query("FooterKey")
            if key.region.width and key.region.right <= size[0]
        }
        assert {"Help", "Events", "Quit"} <= set(shown)  # q stays on screen at 80 columns


async def test_every_panel_of_the_dashboard_is_a_panel_that_shows_a_snapshot():
    app = scripted_app()
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await dashboard_ready(pilot)
        panels = list(screen.query(".panel"))
        assert len(panels) == 6 and all(isinstance(panel, Panel) for panel in panels)


async def test_l_expands_the_events_over_the_dashboard_and_l_or_escape_restores_it():
    app = scripted_app()
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await dashboard_ready(pilot)
        log = screen.query_one(EventLog)
        small = log.size.height
        await pilot.press("l")
        await wait_for(pilot, lambda: screen.maximized is log, what="events maximized")
        await wait_for(pilot, lambda: log.size.height >= 20, what="a tall events panel")
        await pilot.press("l")
        await wait_for(pilot, lambda: screen.maximized is None, what="restored by l")
        await wait_for(pilot, lambda: log.size.height == small, what="the panel's own size")
        await pilot.press("l")
        await wait_for(pilot, lambda: screen.maximized is log, what="maximized again")
        await pilot.press("escape")
        await wait_for(pilot, lambda: screen.maximized is None, what="restored by escape")


async def test_at_80x24_the_probe_table_and_titles_fit_and_the_header_keeps_the_step():
    from textual.widgets import DataTable

    from bsmon.tui.app import BsmonApp
    from bsmon.tui.sources import ScriptedSource

    from ..scripted import NOW, probed_messages

    script = probed_messages()
    script[0].session.world_size, script[0].session.rank = 2, 1  # a rank in the header
    app = BsmonApp(ScriptedSource("job", script, clock=lambda: NOW))
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await dashboard_ready(pilot)
        header = app.screen.query_one("#job")
        line = str(header.render())
        assert line.index("step 3,000") < header.content_size.width  # not cut off
        screen.open_probe_screen()
        await pilot.pause(0.5)
        table = app.screen.query_one(DataTable)
        cut = [c.label.plain for c in table.ordered_columns[:-1]]  # all but the note
        assert sum(c.get_render_width(table) for c in table.ordered_columns[:-1]) <= (
            table.scrollable_content_region.width
        ), cut
        for panel in app.screen.query(".panel"):
            title = str(panel.border_title or "")
            assert len(title) + 4 <= panel.size.width, title  # whole, no "…"


async def test_toasts_do_not_stack_over_the_dashboard():
    from bsmon.tui.app import MAX_TOASTS

    app = scripted_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await dashboard_ready(pilot)
        for i in range(5):
            app.notify(f"toast {i}")
            await pilot.pause(0.05)
        await wait_for(pilot, lambda: "toast 4" in [n.message for n in app._notifications])
        assert len(app._notifications) == MAX_TOASTS
        assert [n.message for n in app._notifications] == ["toast 3", "toast 4"]


@pytest.mark.parametrize("mode", ["run", "attach", "demo"])
async def test_at_80x24_with_ranks_the_footer_and_the_header_fit_whole(mode, monkeypatch):
    from bsmon.tui.app import BsmonApp
    from bsmon.tui.settings import settings
    from bsmon.tui.sources import ScriptedSource

    from ..scripted import NOW
    from .test_tui_ranks import distributed_messages

    monkeypatch.setattr(settings, "mode", mode)
    app = BsmonApp(ScriptedSource("resnet-cifar", distributed_messages(), clock=lambda: NOW))
    async with app.run_test(size=(80, 24)) as pilot:
        await dashboard_ready(pilot)
        await pilot.pause(0.2)
        keys = [key for key in app.screen.query("FooterKey") if key.region.width]
        assert keys and all(key.region.right <= 80 for key in keys)  # no "q Qui", no "d Deta"
        shown = {key.key for key in keys}
        assert {"question_mark", "p", "r", "e", "l", "q"} <= shown
        assert ("d" in shown) == (mode == "run")
        header = app.screen.query_one("#job")
        line = str(header.render())
        assert len(line) <= header.content_size.width  # whole: nothing cut at the end
        assert "rank 0/64" in line and "pid 4242" in line and "step 3,000" in line
