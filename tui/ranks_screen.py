"""Every rank of a distributed job on one screen, grouped by node: compute per step, time
waiting in the collectives, GPU utilization and memory; the straggler (with what makes it
slow, in the agent's words) and late ranks stand out.

Each rank is one cell of CELL_WIDTH columns, so 64 ranks on 8 nodes fit 120×40."""

from __future__ import annotations

from itertools import groupby

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.markup import escape
from textual.widgets import Footer, Static

from bsmon.probes.wire.protocol import STRAGGLER_FLAG, RankReading, RanksReading

from .session import ConnState, Snapshot
from .view_screen import ViewScreen
from .widgets.header import JobHeader

CELL_WIDTH = 29
LEVELS = "▁▂▃▄▅▆▇█"


def ms(seconds: float | None) -> str:
    return "  n/a" if seconds is None else f"{seconds * 1e3:5.1f}"


def compute_s(rank: RankReading) -> float | None:
    if rank.forward_s is None or rank.backward_s is None:
        return None
    return rank.forward_s + rank.backward_s


def heard(rank: RankReading) -> bool:
    """Whether rank 0 ever had a summary of this rank (rank 0 itself always)."""
    return rank.rank == 0 or rank.age_s is not None


def cell(
    rank: RankReading, slowest: float | None, straggler: int | None, finished: bool = False
) -> str:
    """One rank in CELL_WIDTH columns: bar, compute ms, wait ms, util %, memory GiB. When the
    job has finished, silence is its end, not a late rank: the last figures are shown."""
    label = f"r{rank.rank:<3}"
    if not heard(rank):
        text = "ended before a summary" if finished else "not heard from yet"
        return f"[$text-muted]{f'{label} {text}'.ljust(CELL_WIDTH)[:CELL_WIDTH]}[/]"
    if rank.late and not finished:
        age = f"silent {rank.age_s:.0f}s" if rank.age_s is not None else "not heard from"
        return f"[$error]{f'{label} late, {age}'.ljust(CELL_WIDTH)[:CELL_WIDTH]}[/]"
    compute = compute_s(rank)
    bar = LEVELS[min(7, int(8 * compute / slowest))] if compute and slowest else " "
    util = f"{rank.util_percent:3.0f}%" if rank.util_percent is not None else " n/a"
    memory = (
        f"{rank.memory_used_bytes / 2**30:4.0f}G" if rank.memory_used_bytes is not None else "  n/a"
    )
    text = f"{label}{bar}{ms(compute)} {ms(rank.comm_wait_s)} {util} {memory}".ljust(CELL_WIDTH)
    if rank.rank == straggler:
        return f"[b $error]{text}[/]"
    return text


def summary_line(reading: RanksReading, finished: bool = False) -> str:
    """The count of ranks and nodes (a rank never heard from has no host to count), the
    straggler and what makes it slow, late ranks (none once the job has finished: they ended),
    the global batch."""
    nodes = len({r.host for r in reading.ranks if heard(r)})
    parts = [f"[b]{reading.world_size} ranks[/b] on {nodes} node{'s' * (nodes != 1)}"]
    unheard = [f"r{r.rank}" for r in reading.ranks if not heard(r)]
    if unheard:
        when = "before the job ended" if finished else "yet"
        parts.append(f"no summary from {', '.join(unheard)} {when}")
    if reading.straggler is not None and reading.straggler_ratio is not None:
        host = next((r.host for r in reading.ranks if r.rank == reading.straggler), "")
        mark = "[$error]" if reading.straggler_ratio >= STRAGGLER_FLAG else ""
        parts.append(
            f"{mark}straggler r{reading.straggler} ({escape(host)}): "
            f"{reading.straggler_ratio:.2f}× the median rank{'[/]' if mark else ''}"
        )
    late = [f"r{r.rank}" for r in reading.ranks if r.late and heard(r)]
    if late and not finished:
        parts.append(f"[$error]late: {', '.join(late)}[/]")
    if reading.global_batch_size is not None:
        parts.append(f"global batch {reading.global_batch_size:,}")
    cause = f"\n{escape(reading.straggler_cause)}" if reading.straggler_cause else ""
    return " · ".join(parts) + cause + verdicts_line(reading)


def verdicts_line(reading: RanksReading) -> str:
    """Each rank's step-anatomy verdict, ranks grouped by verdict (empty: none yet)."""
    by_verdict: dict[str, list[str]] = {}
    for rank in reading.ranks:
        if rank.verdict is not None and not rank.late:
            by_verdict.setdefault(rank.verdict, []).append(f"r{rank.rank}")
    if not by_verdict:
        return ""
    return "\n" + " · ".join(f"{v}: {', '.join(ranks)}" for v, ranks in by_verdict.items())


def grid_lines(reading: RanksReading, width: int, finished: bool = False) -> list[str]:
    per_line = max(1, width // (CELL_WIDTH + 1))
    computes = [c for r in reading.ranks if not r.late and (c := compute_s(r)) is not None]
    slowest = max(computes, default=None)
    legend = f"{'rank':<5}{'compute':>6} {'wait':>5} {'util':>4} {'mem':>5}"
    cells = min(per_line, len(reading.ranks))
    lines = [f"[$text-muted]{' '.join([legend.ljust(CELL_WIDTH)] * cells).rstrip()}[/]"]
    for host, ranks in groupby(reading.ranks, key=lambda r: r.host):
        members = list(ranks)
        lines.append(
            f"[b]{escape(host or 'no summary yet')}[/b] "
            f"[$text-muted]({len(members)} rank{'s' * (len(members) != 1)})[/]"
        )
        for start in range(0, len(members), per_line):
            row = members[start : start + per_line]
            lines.append(" ".join(cell(r, slowest, reading.straggler, finished) for r in row))
    return lines


class RanksScreen(ViewScreen):
    DEFAULT_CSS = """
    RanksScreen #ranks-summary { height: auto; padding: 0 1; }
    RanksScreen #ranks-grid { padding: 0 1; }
    RanksScreen #ranks-timing { height: auto; padding: 0 1; color: $text-muted; }
    """
    BINDINGS = [Binding("escape,r,q", "close", "Back", id="ranks_back")]

    def compose(self) -> ComposeResult:
        yield JobHeader()
        yield Static("", id="ranks-summary")
        with VerticalScroll():
            yield Static("", id="ranks-grid")
        yield Static("", id="ranks-timing")
        yield Footer()

    def show_view(self, snap: Snapshot) -> None:
        reading = snap.latest.ranks if snap.latest is not None else None
        summary, grid, timing = (
            self.query_one("#ranks-summary", Static),
            self.query_one("#ranks-grid", Static),
            self.query_one("#ranks-timing", Static),
        )
        if reading is None:
            summary.update("[$text-muted]no ranks reading yet (rank 0 gathers every 2 s)[/]")
            return
        finished = snap.state is ConnState.FINISHED
        summary.update(summary_line(reading, finished))
        grid.update("\n".join(grid_lines(reading, self.size.width - 2, finished)))
        timing.update(
            f"compute and wait in ms per step; wait = collective time not hidden behind "
            f"compute; {escape(reading.timing)}"
        )
