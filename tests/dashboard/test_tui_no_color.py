"""NO_COLOR: chart series are told apart by marker, not by grey shades."""

from __future__ import annotations

from bsmon.tui.anatomy_screen import NO_COLOR_MARKS, PhaseChart
from bsmon.tui.widgets.charts import ThroughputChart, marker

from ..scripted import scripted_app
from .test_tui_pilot import dashboard_ready, wait_for


def picture(widget) -> str:
    return widget.render().plain


def test_each_series_gets_its_own_marker_without_colour():
    assert {marker(i, False) for i in range(3)} == {"braille"}
    assert len({marker(i, True) for i in range(6)}) == 6
    assert len(set(NO_COLOR_MARKS)) == len(NO_COLOR_MARKS)


async def test_no_color_throughput_chart_draws_samples_per_s_with_its_own_marker(monkeypatch):
    for no_color in (False, True):
        if no_color:
            monkeypatch.setenv("NO_COLOR", "1")
        app = scripted_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await dashboard_ready(pilot)
            chart = app.screen.query_one(ThroughputChart)
            await wait_for(pilot, lambda c=chart: "samples/s" in picture(c), what="legend")
            text = picture(chart)
            assert any("\u2800" <= ch <= "\u28ff" for ch in text)  # step ms: braille
            assert (text.count("x") > 20) == no_color  # samples/s: x, only without colour
            await pilot.press("t")
            phases = app.screen.query_one(PhaseChart)
            await wait_for(pilot, lambda p=phases: "100" in picture(p), what="anatomy chart")
            assert ("bbbbbbbb" in picture(phases)) == no_color  # backward: filled with b
