"""The ranks view: 64 ranks on 8 nodes at 120×40, the straggler and a late rank marked."""

from __future__ import annotations

from bsmon.tui.app import BsmonApp
from bsmon.tui.ranks_screen import RanksScreen
from bsmon.tui.sources import ScriptedSource

from ..scripted import NOW, distributed_messages, messages
from .test_tui_batch import footer_keys
from .test_tui_pilot import dashboard_ready, text_of, wait_for


async def test_r_opens_the_ranks_view_of_a_distributed_job():
    app = BsmonApp(ScriptedSource("job", distributed_messages(), clock=lambda: NOW))
    async with app.run_test(size=(120, 40)) as pilot:
        await dashboard_ready(pilot)
        assert "ranks" in footer_keys(app)
        assert "global  8,192 over 64 ranks" in text_of(app, "#batch")
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, RanksScreen), what="ranks view")
        await pilot.pause(0.2)
        summary = text_of(app, "#ranks-summary")
        assert "64 ranks on 8 nodes" in summary
        assert "straggler r37 (gpu-node-4): 1.27× the median compute" in summary
        assert "late: r12" in summary and "global batch 8,192" in summary
        grid = text_of(app, "#ranks-grid")
        assert grid.count("gpu-node-") == 8
        assert "r12  late, silent 14s" in grid and "r37" in grid
        assert max(len(line) for line in grid.splitlines()) <= 118
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, RanksScreen), what="back")


async def test_a_single_process_job_has_no_ranks_key():
    app = BsmonApp(ScriptedSource("job", messages(), clock=lambda: NOW))
    async with app.run_test(size=(100, 30)) as pilot:
        await dashboard_ready(pilot)
        assert "ranks" not in footer_keys(app)
        await pilot.press("r")
        await pilot.pause(0.2)
        assert not isinstance(app.screen, RanksScreen)


def test_ranks_view_snapshot(snap_compare):
    async def open_ranks(pilot):
        await dashboard_ready(pilot)
        await pilot.press("r")
        await pilot.pause(0.3)

    app = BsmonApp(ScriptedSource("job", distributed_messages(), clock=lambda: NOW))
    assert snap_compare(app, terminal_size=(120, 40), run_before=open_ranks)
