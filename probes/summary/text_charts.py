"""The summary's text charts, drawn by plotext (one global figure, so one at a time)."""

from __future__ import annotations

import threading

import plotext

from .. import units
from .schema import Point, Summary

CHART_WIDTH = 76
CHART_HEIGHT = 13
_plotext_lock = threading.Lock()  # plotext draws on one global figure


def charts_section(s: Summary) -> str:
    """The summary's Charts section: each series with two points or more."""
    series = s.series
    charts = []
    specs = [
        ("step_time_ms", "step time (ms) by step", "step"),
        ("samples_per_s", "throughput (samples/s) by step", "step"),
    ]
    specs += [
        (k, f"{k.removeprefix('scalar:')} by step", "step")
        for k in series
        if k.startswith("scalar:")
    ]
    specs += [("b_simple", "B_simple (estimate) by step", "step")]
    specs += [
        (k, f"GPU{k[3:].split('_')[0]} utilization (%) by seconds into the run", "seconds")
        for k in series
        if k.startswith("gpu")
    ]
    for key, title, xlabel in specs:
        points = series.get(key)
        if points and len(points) >= 2:
            charts.append(f"```text\n{chart(points, title, xlabel)}\n```\n")
    return "## Charts\n\n" + "\n".join(charts) if charts else ""


def chart(points: list[Point], title: str, xlabel: str) -> str:
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    with _plotext_lock:
        plotext.clear_figure()
        plotext.plot_size(CHART_WIDTH, CHART_HEIGHT)
        plotext.theme("clear")
        plotext.plot(xs, ys, marker="braille")
        for axis, values, whole in ((plotext.xticks, xs, True), (plotext.yticks, ys, False)):
            axis(*units.labelled_ticks(min(values), max(values), 5, whole))  # 2.5k, not 3527.5
        plotext.title(title)
        plotext.xlabel(xlabel)
        text = plotext.uncolorize(plotext.build())
        plotext.clear_figure()
    return "\n".join(line.rstrip() for line in text.splitlines())
