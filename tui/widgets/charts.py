"""Line charts over the run (x = step), drawn with plotext in braille."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from bsmon.probes.wire.protocol import MetricsPoint

from .. import format as fmt
from ..session import Snapshot
from ..settings import settings
from .plot import CachedPlot

LABEL_MIN_ROWS = 10  # a chart this high or higher names its x axis ("step")
# without colour (NO_COLOR) series are told apart by marker; the legend shows each one
NO_COLOR_MARKERS = ("braille", "x", "+", "o", "*", "#")


def marker(index: int, no_color: bool) -> str:
    """The marker of the ``index``-th series: braille, or a distinct one without colour."""
    return NO_COLOR_MARKERS[index % len(NO_COLOR_MARKERS)] if no_color else "braille"


@dataclass(frozen=True)
class Series:
    label: str
    xs: list[float]
    ys: list[float]
    side: str = "left"


def thin(xs: Sequence[float], ys: Sequence[float], limit: int) -> tuple[list[float], list[float]]:
    """At most ``limit`` points, each the mean of a run of neighbours (keeps the shape)."""
    n = len(xs)
    if n <= limit or limit <= 0:
        return list(xs), list(ys)
    size = math.ceil(n / limit)
    out_x, out_y = [], []
    for start in range(0, n, size):
        chunk_y = ys[start : start + size]
        out_x.append(xs[min(start + size, n) - 1])
        out_y.append(sum(chunk_y) / len(chunk_y))
    return out_x, out_y


def series(points: Sequence[MetricsPoint], label: str, value: object, side: str = "left") -> Series:
    xs, ys = [], []
    for point in points:
        y = value(point)  # type: ignore[operator]
        if y is not None and math.isfinite(y):
            xs.append(float(point.step))
            ys.append(float(y))
    return Series(label, xs, ys, side)


def step_ticks(lo: float, hi: float, count: int = 5) -> list[int]:
    """Up to ``count`` round whole-number ticks within [lo, hi] (steps: 2.5k 5k 7.5k)."""
    return [round(t) for t in fmt.ticks(lo, hi, count, whole=True)]


class RunChart(CachedPlot):
    """Base for charts that redraw only when the snapshot brings new points."""

    DEFAULT_CSS = "RunChart { height: 1fr; min-height: 5; }"
    empty_hint = "waiting for steps…"

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._drawn: tuple[int, int, object] | None = None
        self._series: list[Series] | None = None
        self._height = 0
        self._hint = self.empty_hint

    def series_for(self, snap: Snapshot) -> list[Series]:
        raise NotImplementedError

    def show(self, snap: Snapshot) -> None:
        points = snap.points
        self._hint = self.hint(snap)
        key = (len(points), points[-1].step if points else -1, self._hint, self._extra_key(snap))
        if key == self._drawn and self._drawn is not None:
            return
        self._drawn = key
        self.draw(self.series_for(snap))

    def hint(self, snap: Snapshot) -> str:
        """What the chart says while it has nothing to draw."""
        return self.empty_hint

    def _extra_key(self, snap: Snapshot) -> object:
        return None

    def on_resize(self) -> None:
        """Redraw at a new height: the axis label comes and goes with the room."""
        if self._series is not None and self.size.height != self._height:
            self.draw(self._series)

    def draw(self, all_series: list[Series]) -> None:
        self._series, self._height = all_series, self.size.height
        plt = self.plt
        plt.clear_figure()
        limit = max(16, 2 * max(self.size.width, 40))
        drawn = False
        no_color = self.app.no_color
        sides: dict[str, list[float]] = {}
        for index, s in enumerate(all_series):
            if not s.xs:
                continue
            xs, ys = thin(s.xs, s.ys, limit)
            plt.plot(xs, ys, marker=marker(index, no_color), label=s.label, yside=s.side)
            sides.setdefault(s.side, []).extend(ys)
            drawn = True
        rows = max(2, min(5, (self.size.height - 4) // 2))
        for side, ys in sides.items():  # the values' ticks in the dashboard's units: 9.32k
            ticks = fmt.ticks(min(ys), max(ys), rows)
            plt.yticks(ticks, [fmt.count(t) for t in ticks], yside=side)
        if drawn:
            lo = min(min(s.xs) for s in all_series if s.xs)
            hi = max(max(s.xs) for s in all_series if s.xs)
            ticks = step_ticks(lo, hi)
            plt.xticks(ticks, [fmt.count(t) for t in ticks])
        else:
            plt.title(self._hint)
        if self.size.height >= LABEL_MIN_ROWS:  # in a low chart the data takes the row
            plt.xlabel("step")
        self.redraw()


class ThroughputChart(RunChart):
    def series_for(self, snap: Snapshot) -> list[Series]:
        return [
            series(snap.points, "step ms", lambda p: p.step_time_s and p.step_time_s * 1e3),
            series(snap.points, "samples/s", lambda p: p.samples_per_s, side="right"),
        ]


class ScalarChart(RunChart):
    """The logged scalars: ``loss`` when there is one, else the first name logged."""

    empty_hint = "no loss yet: call mon.log(loss=loss)"
    zero_code_hint = "no loss yet: what backward() is called on"  # bsmon run's loss

    def hint(self, snap: Snapshot) -> str:
        zero_code = snap.session.zero_code if snap.session is not None else False
        return self.zero_code_hint if zero_code or settings.mode == "run" else self.empty_hint

    def series_for(self, snap: Snapshot) -> list[Series]:
        name = self.scalar_name(snap)
        if name is None:
            return []
        return [series(snap.points, name, lambda p: p.scalars.get(name))]

    @staticmethod
    def title(snap: Snapshot) -> str:
        """The panel's title: the scalar's name, and what the job says its value is
        ("Loss (summed over the batch)")."""
        name = ScalarChart.scalar_name(snap)
        notes = snap.latest.scalar_notes if snap.latest is not None else {}
        note = notes.get(name or "loss")
        title = name.capitalize() if name else "Loss"
        return f"{title} ({note})" if note else title

    @staticmethod
    def scalar_name(snap: Snapshot) -> str | None:
        names: list[str] = []
        for point in snap.points[-64:]:
            names.extend(k for k in point.scalars if k not in names)
        if "loss" in names:
            return "loss"
        return names[0] if names else None
