"""The gradient noise scale panel: B_simple with its uncertainty, what it means for this job's
batch size, and its history on a log scale with the batch size and the 95% band.

The text is built by ``describe`` (a pure function, tested alone) to fit the rows the left
column can spare: the headline always, then the meaning, the estimator, the interval, and
the chart when there is room for it. Nothing is shown as a number before the job has one:
"collecting" with progress, or a lower bound, or why not.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.markup import escape
from textual.widgets import Static

from bsmon.probes.wire import BALANCED, RAISE, TOO_BIG, TOO_EARLY, noise_verdict, step_batch
from bsmon.probes.wire.protocol import Advice, Capability, MetricsPoint, NoiseScaleReading

from .. import format as fmt
from ..session import Snapshot
from .charts import RunChart, Series, series, step_ticks, thin

ESTIMATOR_NAMES = {
    "per_example": "per example",
    "microbatch": "micro-batches",
    "ddp": "DDP ranks",
    "sharded": "per example, FSDP2 shards",
    "sequential": "sequential",
}
MARKER = "braille"
KEY = "[cyan]━━[/] B_simple  [#8a8a8a]━━[/] 95%  [orange]──[/] batch"
NO_COLOR_KEY = "⣿⣿ B_simple  ·· 95%  ── batch"  # told apart by marker (NO_COLOR)
CHART_MIN_ROWS = 7
CHART_MAX_ROWS = 12
CITATION = "an order-of-magnitude guide (McCandlish et al. 2018)"


@dataclass(frozen=True)
class Line:
    text: str
    style: str = ""  # Textual markup style for the whole line, e.g. "$text-muted"
    priority: int = 0  # lower is kept first when rows are short


def value(x: float) -> str:
    """B_simple-scale numbers: 34.3, 111, 1.23k, 45.6k."""
    if x < 100:
        return f"{x:.3g}"
    return fmt.count(x)


def headline(reading: NoiseScaleReading) -> str:
    b = reading.b_simple
    if b is None:
        return ""
    text = f"B_simple ≈ {value(b)}"
    if reading.stderr is not None:
        text += f" ± {uncertainty(reading.stderr)}"
    return text


def uncertainty(x: float) -> str:
    """A standard error to two significant digits: 41, 4.1, 1.2k."""
    if x >= 1000:
        return fmt.count(float(f"{x:.2g}"))
    return f"{float(f'{x:.2g}'):g}"


def estimator_text(reading: NoiseScaleReading) -> str:
    name = ESTIMATOR_NAMES.get(reading.estimator or "", reading.estimator or "not reported")
    parts = [f"estimate: {name}"]
    if reading.coverage is not None and reading.coverage < 0.995:
        parts.append(f"{reading.coverage:.0%} of params")
    if reading.preconditioned:
        parts.append("Adam-preconditioned")
    if reading.phase:
        parts.append(reading.phase)
    return " · ".join(parts)


def meaning(
    batch: int | None,
    b: float,
    *,
    bound: bool = False,
    compact: bool = False,
    advice: Advice | None = None,
    ranks: int = 1,
) -> list[Line]:
    """What B_simple = b says about a batch of ``batch`` on each of ``ranks`` ranks (the
    paper's eqs. 2.7 and 2.11: B_simple counts a step's examples, every rank's);
    ``bound``: b is only a lower bound, which says to raise a batch below it and nothing yet
    about one above it. With the advisor's answer (``advice``), the verdict on steps alone
    stands beside it, and the answer is the advisor's: it weighs the step time too."""
    if not batch:
        return [Line("a batch near B_simple balances steps against samples", priority=2)]
    stated = step_batch(batch, ranks)
    batch *= ranks
    worth = batch / (batch + b)
    relation = "≤" if bound else "≈"
    verdict = noise_verdict(batch, b, bound)
    if advice is not None:
        said = f"{verdict} counting steps alone · advice: {advice.headline} ({advice.why})"
    else:  # a job or record from before the advisor
        said = {
            RAISE: f"raising the batch toward {value(b)} cuts steps with little loss of sample "
            "efficiency",
            TOO_EARLY: "too early to say whether a larger batch pays",
            TOO_BIG: "the batch is far above B_simple: a larger one wastes compute",
            BALANCED: "the batch is near B_simple: a balance of steps and samples",
        }[verdict]
    if compact:
        answer = f"advice: {advice.headline}" if advice is not None else verdict
        return [Line(f"B={batch:,} step worth {relation}{worth:.0%} · {answer}")]
    lines = [Line(f"at batch {stated} a step is worth {relation}{worth:.0%} of a noiseless step")]
    lines.append(Line(said, priority=1))
    if not bound:
        steps, samples = 1 + b / batch, 1 + batch / b
        lines.append(
            Line(
                f"steps ×{steps:.2g}, samples ×{samples:.2g} of their minimum",
                "$text-muted",
                priority=3,
            )
        )
    return lines


def describe(
    reading: NoiseScaleReading | None,
    capability: Capability | None,
    batch: int | None,
    compact: bool = False,
    advice: Advice | None = None,
) -> list[Line]:
    """Every line the panel could show, each with its priority; ``compact``: the meaning in
    one short line, for a panel with only a few rows."""
    if capability is None:
        return [Line("waiting for the job…", "$text-muted")]
    off = reading is not None and reading.estimator is None and reading.note
    if not capability.available or off:
        reason = (reading.note if reading else None) or capability.reason or "not enabled"
        return [Line(f"B_simple: n/a — {reason}", "$text-muted")]
    reading = reading or NoiseScaleReading()
    biased = reading.biased
    tag = " · BIASED" if biased else ""
    lines: list[Line] = []
    if reading.b_simple is not None:
        lines.append(Line(headline(reading), "b"))
        if biased:
            lines.append(Line("biased: consecutive steps, for comparison only", "$error"))
        lines.extend(
            meaning(batch, reading.b_simple, compact=compact, advice=advice, ranks=reading.ranks)
        )
        lines.append(Line(CITATION, "$text-muted italic", priority=2))
        lines.append(Line(estimator_text(reading) + tag, "$text-muted", priority=2))
        if reading.ci_low is not None and reading.ci_high is not None:
            interval = f"95% interval {value(reading.ci_low)}–{value(reading.ci_high)}"
            lines.append(Line(interval, "$text-muted", priority=3))
    elif reading.lower_bound is not None:
        lines.append(Line(f"B_simple > {value(reading.lower_bound)} (lower bound)", "b"))
        lines.append(Line("|G|² not resolved from the noise yet", "$text-muted", priority=2))
        lines.extend(
            meaning(
                batch,
                reading.lower_bound,
                bound=True,
                compact=compact,
                advice=advice,
                ranks=reading.ranks,
            )
        )
        lines.append(Line(estimator_text(reading) + tag, "$text-muted", priority=2))
    else:
        if reading.status:  # the job's words (older jobs and records send none)
            lines.append(Line(f"B_simple: {reading.status}", "$text-muted"))
        elif reading.needed and reading.effective >= reading.needed and reading.note:
            lines.append(Line(f"B_simple: none — {reading.note}", "$text-muted"))
            reading = msgspec.structs.replace(reading, note=None)  # said once, not as a skip
        elif reading.needed:
            progress = f"{min(reading.effective, reading.needed):.0f}/{reading.needed}"
            lines.append(Line(f"B_simple: collecting {progress} steps", "$text-muted"))
        else:  # the first frame: the job has not reported a measured step yet
            lines.append(Line("B_simple: collecting (no step measured yet)", "$text-muted"))
        if reading.estimator is not None:
            lines.append(Line(estimator_text(reading) + tag, "$text-muted", priority=1))
        if biased:
            lines.append(Line("biased: consecutive steps, for comparison only", "$error"))
    if reading.detail:
        lines.append(Line(reading.detail, "$text-muted", priority=4))
    if reading.note:
        lines.append(Line(f"last step skipped: {reading.note}", "$warning", priority=2))
    if reading.skipped_steps:
        lines.append(Line(f"{reading.skipped_steps:,} steps skipped", "$text-muted", priority=4))
    return lines


def fit(lines: Sequence[Line], width: int, rows: int) -> list[tuple[Line, list[str]]]:
    """The lines (wrapped to ``width``) that fit in ``rows``, by priority, in their order."""
    wrapped = [(line, textwrap.wrap(line.text, max(width, 12)) or [""]) for line in lines]
    kept: set[int] = set()
    used = 0
    for index in sorted(range(len(wrapped)), key=lambda i: wrapped[i][0].priority):
        need = len(wrapped[index][1])
        if index == 0 or used + need <= rows:  # the first line always shows
            kept.add(index)
            used += need
    return [wrapped[i] for i in range(len(wrapped)) if i in kept]


def _rows_needed(lines: Sequence[Line], width: int, priority: int) -> int:
    wanted = [x for x in lines if x.priority <= priority]
    return sum(len(parts) for _, parts in fit(wanted, width, 999))


def render(kept: list[tuple[Line, list[str]]]) -> str:
    out = []
    for line, parts in kept:
        for part in parts:
            text = escape(part)
            out.append(f"[{line.style}]{text}[/]" if line.style else text)
    return "\n".join(out)


def noise_points(points: Sequence[MetricsPoint]) -> list[MetricsPoint]:
    return [p for p in points if p.noise is not None and p.noise.b_simple is not None]


def log_ticks(lo: float, hi: float) -> list[float]:
    """1-2-5 ticks spanning [lo, hi] (at most five); over a narrow range, where fewer than two
    of those fall inside, the finer 1-1.5-2-3-5-7 series."""
    for mantissas in ((1, 2, 5), (1, 1.5, 2, 3, 5, 7)):
        ticks = []
        exponent = math.floor(math.log10(lo))
        while 10**exponent <= hi * 10:
            for mantissa in mantissas:
                tick = mantissa * 10**exponent
                if lo <= tick <= hi:
                    ticks.append(float(tick))
            exponent += 1
        if len(ticks) >= 2:
            break
    while len(ticks) > 5:
        ticks = ticks[::2]
    return ticks


def step_examples(snap: Snapshot) -> int | None:
    """The latest step's examples over every rank: what B_simple is drawn against."""
    latest = snap.latest
    if latest is None or latest.batch_size is None:
        return None
    return latest.batch_size * (latest.noise.ranks if latest.noise is not None else 1)


class NoiseChart(RunChart):
    """B_simple over the run on a log scale, its 95% band, and the batch size as a line."""

    empty_hint = "no estimate yet"

    def _extra_key(self, snap: Snapshot) -> object:
        return step_examples(snap)

    def series_for(self, snap: Snapshot) -> list[Series]:
        pts = noise_points(snap.points)
        return [
            series(pts, "95%", lambda p: p.noise.ci_high),
            series(pts, "", lambda p: p.noise.ci_low),
            series(pts, "B_simple", lambda p: p.noise.b_simple),
        ]

    def show(self, snap: Snapshot) -> None:
        self._batch = step_examples(snap)
        super().show(snap)

    def draw(self, all_series: list[Series]) -> None:
        """A log-scale chart, drawn as log10 of the values on a linear axis with the ticks
        labelled in B_simple units (plotext's own log scale transforms the data again on
        every re-render inside Textual)."""
        plt = self.plt
        plt.clear_figure()
        band_high, band_low, main = all_series
        if not main.xs:
            plt.title(self.empty_hint)
            self.redraw()
            return
        limit = max(16, 2 * max(self.size.width, 40))
        batch = getattr(self, "_batch", None)
        values = [*main.ys, *band_high.ys, *band_low.ys] + ([batch] if batch else [])
        values = [v for v in values if v > 0]
        band_marker = "·" if self.app.no_color else MARKER
        for band in (band_high, band_low):  # the key is a line of text under the chart
            if band.xs:
                xs, ys = thin(band.xs, [math.log10(v) for v in band.ys], limit)
                plt.plot(xs, ys, marker=band_marker, color="gray")
        xs, ys = thin(main.xs, [math.log10(v) for v in main.ys], limit)
        plt.plot(xs, ys, marker=MARKER, color="cyan")
        if batch:
            plt.hline(math.log10(batch), "orange")
        ticks = log_ticks(min(values), max(values))
        if ticks:
            plt.yticks([math.log10(t) for t in ticks], [value(t) for t in ticks])
        xticks = step_ticks(min(main.xs), max(main.xs), 3)
        plt.xticks(xticks, [fmt.count(t) for t in xticks])
        self.redraw()


class NoisePanel(Vertical):
    DEFAULT_CSS = """
    NoisePanel { height: auto; }
    NoisePanel > #noise-text { height: auto; }
    NoisePanel > NoiseChart { height: 8; min-height: 0; }
    NoisePanel > #noise-key { height: 1; }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._snap: Snapshot | None = None
        self._fitted_to: tuple[int, int] | None = None

    def compose(self) -> ComposeResult:
        yield Static("", id="noise-text")
        yield NoiseChart(id="noise-chart")
        yield Static(NO_COLOR_KEY if self.app.no_color else KEY, id="noise-key")

    def rows_to_spare(self) -> int:
        """Rows this panel's content may take: the column's height less the other panels
        (at their current size)."""
        column = self.parent
        if column is None or not column.size.height:
            return 3
        others = sum(w.outer_size.height for w in column.children if w is not self and w.display)
        border = self.outer_size.height - self.content_size.height if self.size.height else 2
        return max(1, column.size.height - others - border)

    def show(self, snap: Snapshot) -> None:
        self._snap = snap
        latest = snap.latest
        reading = latest.noise if latest is not None else None
        batch = latest.batch_size if latest is not None else None
        advice = latest.advice if latest is not None else None
        rows = self.rows_to_spare()
        width = self.content_size.width or 32
        self._fitted_to = (rows, width)
        lines = describe(reading, snap.noise_capability, batch, advice=advice)
        if _rows_needed(lines, width, 1) > rows:
            lines = describe(reading, snap.noise_capability, batch, compact=True, advice=advice)
        essential = min(rows, _rows_needed(lines, width, 2))
        chart = self.query_one(NoiseChart)
        chart_rows = min(CHART_MAX_ROWS, rows - essential - 1)  # and a row for the key
        show_chart = bool(noise_points(snap.points)) and chart_rows >= CHART_MIN_ROWS
        kept = fit(lines, width, rows - chart_rows - 1 if show_chart else rows)
        self.query_one("#noise-text", Static).update(render(kept))
        chart.display = show_chart
        self.query_one("#noise-key").display = show_chart
        if show_chart:
            chart.styles.height = chart_rows
            chart.show(snap)
        self.call_after_refresh(self._settle)

    def _settle(self) -> None:
        """Fit again once the layout has settled (the panels above may have changed size)."""
        if self._snap is not None and self._fitted_to != (
            self.rows_to_spare(),
            self.content_size.width or 32,
        ):
            self.show(self._snap)

    def on_resize(self) -> None:
        if self._snap is not None:
            self.show(self._snap)
