"""Where each step's time goes: the verdict in words, the last steps' breakdown as bars, and
the breakdown over the run as a stacked chart (one bar per stretch of history)."""

from __future__ import annotations

from collections.abc import Sequence

from textual.app import ComposeResult
from textual.binding import Binding
from textual.markup import escape
from textual.widgets import Footer, Static

from bsmon.probes.wire.protocol import MetricsPoint, StepAnatomy

from . import format as fmt
from .session import Snapshot
from .view_screen import ViewScreen
from .widgets.charts import step_ticks
from .widgets.header import JobHeader
from .widgets.plot import CachedPlot

# phase, label, colour (the bars and the chart share it)
PHASES = (
    ("data", "waiting for data", (255, 135, 0)),
    ("forward", "forward + loss", (95, 135, 255)),
    ("backward", "backward", (0, 175, 175)),
    ("comm", "collective wait", (215, 95, 215)),
    ("optimizer", "optimizer step", (95, 175, 95)),
    ("other", "other", (128, 128, 128)),
)
CHART_POINTS = 120
TITLE = "share of each step over the run (%)"
# without colour (NO_COLOR) each phase is filled with its initial
NO_COLOR_MARKS = ("d", "f", "b", "c", "o", "·")
NO_COLOR_TITLE = "share of each step (%): d data f fwd b bwd c comm o optim · other"


def shares(anatomy: StepAnatomy) -> list[float | None]:
    """Each phase's share of the step (None: not measured)."""
    step = anatomy.step_s or 0.0
    out: list[float | None] = []
    for phase, *_ in PHASES:
        seconds = getattr(anatomy, f"{phase}_s")
        out.append(None if seconds is None or not step else seconds / step)
    return out


def bar_lines(anatomy: StepAnatomy, width: int) -> list[str]:
    """One line per phase: label, milliseconds per step, share, and a bar."""
    lines = []
    bar_width = max(4, width - 34)
    for (phase, label, rgb), share in zip(PHASES, shares(anatomy), strict=True):
        colour = "#{:02x}{:02x}{:02x}".format(*rgb)
        seconds = getattr(anatomy, f"{phase}_s")
        if share is None:
            if phase == "comm" and not any("communication" in n for n in anatomy.notes):
                continue  # one device: there is no collective to wait for
            lines.append(f"{label:<17} [$text-muted]not measured[/]")
            continue
        bar = "█" * round(share * bar_width)
        lines.append(f"{label:<17}{seconds * 1e3:8.1f} ms {share:5.0%}  [{colour}]{bar}[/]")
    return lines


def verdict_text(anatomy: StepAnatomy | None) -> str:
    if anatomy is None:
        return (
            "[$text-muted]no breakdown yet: it needs steps with a backward pass "
            "(and this job's bsmon to measure it)[/]"
        )
    if anatomy.verdict is None:
        return f"[$text-muted]{anatomy.steps} steps split; a verdict after 10[/]"
    return (
        f"[b]{anatomy.verdict}[/b]: {escape(anatomy.evidence)}\n"
        f"[$text-muted]try: [/]{escape(anatomy.advice)}"
    )


class PhaseChart(CachedPlot):
    """Each phase's share of the step over the run, stacked: the phases' running totals are
    drawn from the top one down, each filled to the axis over the one before."""

    DEFAULT_CSS = "PhaseChart { height: 1fr; min-height: 6; }"

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._drawn: tuple[int, int, int] | None = None

    def show(self, points: Sequence[MetricsPoint]) -> None:
        with_anatomy = [p for p in points if p.anatomy is not None and p.anatomy.step_s]
        last = with_anatomy[-1].step if with_anatomy else -1
        key = (len(with_anatomy), last, self.size.height)  # the ticks follow the height
        if key == self._drawn:
            return
        self._drawn = key
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(NO_COLOR_TITLE if self.app.no_color else TITLE)
        if with_anatomy:
            every = with_anatomy[:: max(1, len(with_anatomy) // CHART_POINTS)]
            self._stack(plt, every, self.app.no_color, rows=(self.size.height - 4) // 2)
        self.redraw()

    @staticmethod
    def _stack(plt: object, points: Sequence[MetricsPoint], no_color: bool, rows: int = 5) -> None:
        steps = [float(p.step) for p in points]
        per_point = [shares(p.anatomy) for p in points if p.anatomy is not None]
        running = [[0.0] * len(points)]
        for k in range(len(PHASES)):
            running.append(
                [r + 100 * (s[k] or 0.0) for r, s in zip(running[-1], per_point, strict=True)]
            )
        for k in reversed(range(len(PHASES))):
            top = running[k + 1]
            if top != running[k]:  # a phase with no time at all is not drawn
                mark = NO_COLOR_MARKS[k] if no_color else "braille"
                plt.plot(steps, top, fillx=True, marker=mark, color=PHASES[k][2])  # type: ignore[attr-defined]
        plt.ylim(0, 100)  # type: ignore[attr-defined]
        percents = fmt.ticks(0, 100, max(2, min(5, rows)))  # one a row or fewer
        plt.yticks(percents, [fmt.count(t) for t in percents])  # type: ignore[attr-defined]
        ticks = step_ticks(steps[0], steps[-1])
        plt.xticks(ticks, [fmt.count(t) for t in ticks])  # type: ignore[attr-defined]


class AnatomyScreen(ViewScreen):
    DEFAULT_CSS = """
    AnatomyScreen #anatomy-verdict { height: auto; padding: 0 1; }
    AnatomyScreen #anatomy-bars { height: auto; padding: 0 1; margin-top: 1; }
    AnatomyScreen #anatomy-notes { height: auto; padding: 0 1; color: $text-muted; }
    """
    BINDINGS = [Binding("escape,t,q", "close", "Back", id="anatomy_back")]

    def compose(self) -> ComposeResult:
        yield JobHeader()
        yield Static("", id="anatomy-verdict")
        yield Static("", id="anatomy-bars")
        yield PhaseChart(id="anatomy-chart")
        yield Static("", id="anatomy-notes")
        yield Footer()

    def show_view(self, snap: Snapshot) -> None:
        anatomy = snap.latest.anatomy if snap.latest is not None else None
        self.query_one("#anatomy-verdict", Static).update(verdict_text(anatomy))
        bars = self.query_one("#anatomy-bars", Static)
        notes = self.query_one("#anatomy-notes", Static)
        if anatomy is None:
            bars.update("")
            notes.update("")
        else:
            bars.update("\n".join(bar_lines(anatomy, self.size.width - 2)))
            whole = snap.replay is not None and snap.replay.ended is not None
            span = (
                f"the whole recorded run ({anatomy.steps:,} steps)"
                if whole
                else (f"the last {anatomy.steps} steps")
            )
            about = f"per step over {span}, {anatomy.clock or 'wall clock'}"
            notes.update(escape("; ".join([about, *anatomy.notes])))
        self.query_one(PhaseChart).show(snap.points)
