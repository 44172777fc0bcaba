"""The probe screen: live progress, the measured points, memory and throughput against batch
size, the prediction, the what-ifs, and one recommendation that a key applies."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.markup import escape
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from bsmon.probes.wire import describe_prediction, describe_recommendation, describe_what_if
from bsmon.probes.wire.protocol import ProbePoint, ProbeReading, ProbeResult

from . import format as fmt
from .session import Snapshot
from .widgets.header import JobHeader
from .widgets.plot import CachedPlot

COLUMNS = ("batch", "fit", "peak", "step", "samples/s", "note")
GIB = 2**30
FIT_SEGMENTS = 8  # the fitted memory curve, drawn as this many segments


def set_int_xticks(plt: object, xs: list[int]) -> None:
    """Whole-number batch sizes on the x axis (plotext would print 131.5)."""
    if xs:
        ticks = sorted(set(xs))
        plt.xticks(ticks, [fmt.count(t) for t in ticks])  # type: ignore[attr-defined]


def set_round_yticks(plt: object, lo: float, hi: float) -> None:
    """Round values on the y axis (plotext would print 1862.1)."""
    ticks = fmt.ticks(lo, hi, 4)
    plt.yticks(ticks, [fmt.count(t) for t in ticks])  # type: ignore[attr-defined]


def fitted_peak(result: ProbeResult, size: int) -> float:
    curvature = result.fit_curvature_bytes or 0.0
    return (
        (result.fit_intercept_bytes or 0.0)
        + (result.fit_slope_bytes or 0.0) * size
        + (curvature * size * size)
    )


def point_row(point: ProbePoint) -> tuple[str, ...]:
    return (
        f"{point.batch_size:,}",
        "yes" if point.fits else "[b]no[/b]",
        fmt.bytes_(point.peak_bytes),
        fmt.duration(point.step_time_s),
        fmt.rate(point.samples_per_s, ""),
        point.note or "",
    )


def status_text(reading: ProbeReading, now: float) -> str:
    if reading.status == "running":
        elapsed = fmt.clock(now - reading.started) if reading.started else ""
        return f"[$warning]◌ running[/] {elapsed} — {escape(reading.message)}"
    if reading.result is None:
        return "[$text-muted]no probe has run yet: press p on the dashboard to start one[/]"
    result = reading.result
    if result.status != "ok":
        return f"[$error]✖ probe {result.status}:[/] {escape(result.error or '')}"
    return f"[$success]✔ done[/] in {fmt.duration(result.duration_s)} on {result.device}"


def recommendation_text(result: ProbeResult | None) -> str:
    """What ``a`` applies and its first reason: the screen's answer, shown first."""
    if result is None or result.status != "ok" or result.recommendation is None:
        return ""
    rec = result.recommendation
    sure = f"; confidence {rec.confidence}" if rec.confidence else ""
    if rec.stay:
        line = f"[b]recommended: {describe_recommendation(rec)}[/b] (the job's size now{sure})"
    else:
        line = f"[b]recommended batch: {rec.batch_size:,}[/b] — press [b]a[/b] to apply"
        line += f" [$text-muted]· confidence {rec.confidence}[/]" if rec.confidence else ""
    return "\n".join([line, *(f"  · {escape(reason)}" for reason in rec.reasons[:1])])


def findings_text(result: ProbeResult | None) -> str:
    """The rest: the largest size that ran, the prediction, the what-ifs, the other reasons."""
    if result is None or result.status != "ok":
        return ""
    lines = [f"largest batch that ran: [b]{result.max_batch_size:,}[/b]"]
    if (prediction := describe_prediction(result)) is not None:
        lines.append(escape(prediction))
    lines.extend(f"  {escape(describe_what_if(w))}" for w in result.what_ifs)
    if result.recommendation is not None and len(result.recommendation.reasons) > 1:
        lines.append("the recommendation's other reasons:")
        lines.extend(f"  · {escape(reason)}" for reason in result.recommendation.reasons[1:])
    if result.recommendation is not None and result.recommendation.would_change:
        lines.append(f"what would change it: {escape(result.recommendation.would_change)}")
    lines.extend(f"[$warning]note:[/] {escape(note)}" for note in result.notes)
    return "\n".join(lines)


class ProbeScreen(Screen[None]):
    DEFAULT_CSS = """
    ProbeScreen #probe-status { height: auto; padding: 0 1; }
    ProbeScreen #recommendation { height: auto; padding: 0 1; }
    ProbeScreen #probe-body { height: 1fr; }
    ProbeScreen #probe-left { width: 1fr; min-width: 50; }  /* the table's columns, at 80 */
    ProbeScreen #probe-charts { width: 1fr; }
    ProbeScreen DataTable { height: auto; }
    ProbeScreen #findings { height: auto; padding: 0 1; }
    ProbeScreen CachedPlot { height: 1fr; min-height: 6; }
    """
    BINDINGS = [
        Binding("a", "apply", "Apply recommendation", id="probe_apply"),
        Binding("escape,q", "close", "Back", id="probe_back"),
    ]

    def __init__(self, apply: object, can_apply: bool, snapshot: Snapshot | None = None) -> None:
        super().__init__()
        self._apply = apply
        self._can_apply = can_apply
        self._first = snapshot
        self._reading: ProbeReading | None = None
        self._drawn: object = None

    def compose(self) -> ComposeResult:
        yield JobHeader()
        yield Static("", id="probe-status")
        yield Static("", id="recommendation")  # first: at 80x24 the rest scrolls below it
        with Horizontal(id="probe-body"):
            with VerticalScroll(id="probe-left", classes="panel"):  # focused: ↑ ↓ PgDn scroll
                table = DataTable(id="points", cursor_type="none", zebra_stripes=True)
                table.can_focus = False  # the panel scrolls as one, table included
                yield table
                yield Static("", id="findings")
            with Vertical(id="probe-charts"):
                yield CachedPlot(id="memory-chart", classes="panel")
                yield CachedPlot(id="speed-chart", classes="panel")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#points", DataTable).add_columns(*COLUMNS)
        self.query_one("#probe-left").border_title = "Probe: largest batch (sidecar)"
        self.query_one("#memory-chart").border_title = "Peak GiB by batch"
        self.query_one("#speed-chart").border_title = "Samples/s by batch"
        self.query_one("#probe-left").focus()
        if self._first is not None:
            self.show(self._first)

    def show(self, snap: Snapshot) -> None:
        self.query_one(JobHeader).show(snap)
        reading = snap.latest.probe if snap.latest is not None else ProbeReading()
        self._reading = reading
        self.query_one("#probe-status", Static).update(status_text(reading, snap.now))
        recommendation = recommendation_text(reading.result)
        self.query_one("#recommendation", Static).update(recommendation)
        self.query_one("#recommendation").display = bool(recommendation)
        self.query_one("#findings", Static).update(findings_text(reading.result))
        key = (reading.status, len(reading.points), reading.result is not None)
        if key != self._drawn:
            self._drawn = key
            self._draw(reading)
        self.refresh_bindings()

    def _draw(self, reading: ProbeReading) -> None:
        table = self.query_one("#points", DataTable)
        table.clear()
        for point in reading.points:
            table.add_row(*point_row(point))
        self._draw_memory(reading)
        self._draw_speed(reading)
        for chart in self.query(CachedPlot):
            chart.redraw()

    def _draw_memory(self, reading: ProbeReading) -> None:
        """Measured peaks (●), sizes that did not fit (✗, at the budget), the fitted line, and
        the budget as a horizontal line."""
        plt = self.query_one("#memory-chart", CachedPlot).plt
        plt.clear_figure()
        result = reading.result
        budget = result.budget_bytes / GIB if result and result.budget_bytes else None
        fitting = [p for p in reading.points if p.fits and p.peak_bytes]
        failed = [p.batch_size for p in reading.points if not p.fits]
        xs = [p.batch_size for p in fitting]
        if result is not None and result.fit_slope_bytes and xs:
            top = max(*xs, *failed, result.predicted_max or 0)
            start = xs[0] // 2
            line = [start + (top - start) * i // FIT_SEGMENTS for i in range(FIT_SEGMENTS + 1)]
            peaks = [fitted_peak(result, x) / GIB for x in line]
            plt.plot(line, peaks, marker="braille", label="fit")
        if xs:
            plt.scatter(xs, [p.peak_bytes / GIB for p in fitting], marker="●", label="measured")
        if failed and budget:
            plt.scatter(failed, [budget] * len(failed), marker="✗", label="did not fit")
        if budget:
            plt.hline(budget)
            plt.ylim(0, budget * 1.1)
            plt.title(f"budget {budget:.1f} GiB")
            set_round_yticks(plt, 0, budget * 1.1)
        set_int_xticks(plt, xs + failed)

    def _draw_speed(self, reading: ProbeReading) -> None:
        plt = self.query_one("#speed-chart", CachedPlot).plt
        plt.clear_figure()
        rated = [p for p in reading.points if p.samples_per_s]
        if rated:
            xs = [p.batch_size for p in rated]
            plt.plot(xs, [p.samples_per_s for p in rated], marker="braille")
            plt.scatter(xs, [p.samples_per_s for p in rated], marker="●")
            set_int_xticks(plt, xs)
            speeds = [p.samples_per_s for p in rated]
            set_round_yticks(plt, min(speeds), max(speeds))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action != "apply":
            return True
        if not self._can_apply:
            return False
        result = self._reading.result if self._reading else None
        rec = result.recommendation if result is not None else None
        return True if rec is not None and not rec.stay else None  # "stay": nothing to apply

    def action_apply(self) -> None:
        result = self._reading.result if self._reading else None
        if result is not None and result.recommendation is not None:
            if result.recommendation.stay:
                return
            self._apply(result.recommendation.batch_size)  # type: ignore[operator]

    def action_close(self) -> None:
        self.dismiss(None)
