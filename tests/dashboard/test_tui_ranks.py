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
        assert "straggler r37 (gpu-node-4): 1.27× the median rank" in summary
        assert "r37 is slow in compute: 41.5 ms a step" in summary  # the agent's words
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


async def ranks_view_of(script: list) -> tuple[str, str]:
    """The ranks view's summary line and grid for a scripted session."""
    app = BsmonApp(ScriptedSource("job", script, clock=lambda: NOW))
    async with app.run_test(size=(120, 40)) as pilot:
        await dashboard_ready(pilot)
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, RanksScreen), what="ranks")
        await pilot.pause(0.2)
        return text_of(app, "#ranks-summary"), text_of(app, "#ranks-grid")


async def test_a_finished_job_whose_rank_ended_before_its_first_summary_is_not_called_late():
    """torchrun's 300 steps can end before rank 1's first summary reaches rank 0 (2 s): one
    host, no late rank, and the rank said to have ended first (finding 13 of issue 25)."""
    from bsmon.probes.wire import protocol

    script = messages()
    script[0].session.rank, script[0].session.world_size = 0, 2
    r0 = protocol.RankReading(
        rank=0, host="vm", step=300, age_s=0.0, forward_s=0.01, backward_s=0.02, batch_size=32
    )
    r1 = protocol.RankReading(rank=1, late=True)  # never heard from
    script[-1].ranks = protocol.RanksReading(world_size=2, ranks=[r0, r1], timing="ddp")
    summary, grid = await ranks_view_of(script)
    assert summary == "2 ranks on 1 node · no summary from r1 yet"
    assert "not heard from yet" in grid and "late" not in grid and "unknown host" not in grid
    summary, grid = await ranks_view_of([*script, protocol.Bye(t=NOW, reason="closed")])
    assert summary == "2 ranks on 1 node · no summary from r1 before the job ended"
    assert "ended before a summary" in grid and "late" not in grid
