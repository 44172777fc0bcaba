"""The step-anatomy view (`t`): Pilot and SVG snapshots on a scripted job that turned
input-bound, and the one-line verdict on the dashboard."""

from __future__ import annotations

import re

import pytest
from textual.widgets import Static

from bsmon.probes.wire import protocol
from bsmon.tui.anatomy_screen import AnatomyScreen, PhaseChart, bar_lines
from bsmon.tui.app import BsmonApp
from bsmon.tui.sources import ScriptedSource
from bsmon.tui.widgets.batch import headline

from ..scripted import NOW, anatomy_reading, messages, scripted_app
from .test_tui_pilot import dashboard_ready

SIZES = [(80, 24), (120, 40)]


async def open_anatomy(pilot) -> None:
    await dashboard_ready(pilot)
    await pilot.press("t")
    await pilot.pause(0.3)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_anatomy_view_snapshot(snap_compare, size):
    assert snap_compare(scripted_app(), terminal_size=size, run_before=open_anatomy)


async def test_t_opens_the_view_with_the_verdict_bars_and_chart_and_t_closes_it():
    app = scripted_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await dashboard_ready(pilot)
        batch = str(app.screen.query_one("#batch", Static).render())
        assert re.search(r"step\s+[\d.]+ ms · input-bound", batch), batch
        await pilot.press("t")
        await pilot.pause(0.3)
        screen = app.screen
        assert isinstance(screen, AnatomyScreen)
        verdict = str(screen.query_one("#anatomy-verdict", Static).render())
        assert verdict.startswith("input-bound: 31% of each step waits for data")
        assert "num_workers" in verdict
        bars = str(screen.query_one("#anatomy-bars", Static).render())
        assert "waiting for data" in bars and "collective wait" not in bars  # one device
        assert screen.query_one(PhaseChart)._drawn[0] > 100  # every history point drawn
        await pilot.press("t")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, AnatomyScreen)


async def test_a_job_without_a_breakdown_says_what_it_needs():
    script = messages()
    script[-1].anatomy = None
    for point in script[1].points:
        point.anatomy = None
    app = BsmonApp(ScriptedSource("job", script, clock=lambda: NOW))
    async with app.run_test(size=(80, 24)) as pilot:
        await open_anatomy(pilot)
        verdict = str(app.screen.query_one("#anatomy-verdict", Static).render())
        assert verdict.startswith("no breakdown yet")
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert "bound" not in str(app.screen.query_one("#batch", Static).render())


def test_bars_say_not_measured_and_keep_the_collective_wait_for_distributed_jobs():
    anatomy = anatomy_reading(3000, 0.04)
    anatomy.data_s = None
    lines = bar_lines(anatomy, 80)
    assert any(line.startswith("waiting for data") and "not measured" in line for line in lines)
    assert not any("collective wait" in line for line in lines)
    anatomy.notes = ["communication: not measured (the model is not DistributedDataParallel)"]
    lines = bar_lines(anatomy, 80)
    assert any("collective wait" in line and "not measured" in line for line in lines)
    assert headline(protocol.StepAnatomy()) is None
