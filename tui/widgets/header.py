"""The one-line header: job, step, rank, uptime, host, pid and the state (LIVE, SILENT 12s...)."""

from __future__ import annotations

from rich.cells import cell_len
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.markup import escape
from textual.widgets import Static

from .. import format as fmt
from ..session import ConnState, Snapshot

BRAND = "bsmon"
SEPARATOR = " · "
DROPPED_FIRST = ("host", "up", "rank", "pid", "step")  # when the line does not fit
STATE_LABELS = {
    ConnState.CONNECTING: "◌ CONNECTING",
    ConnState.LIVE: "● LIVE",
    ConnState.FINISHED: "■ FINISHED",
    ConnState.DISCONNECTED: "○ DISCONNECTED",
}


class JobHeader(Horizontal):
    DEFAULT_CSS = """
    JobHeader { height: 1; background: $panel; }
    JobHeader #brand {
        width: auto; padding: 0 1; background: $primary; color: $text; text-style: bold;
    }
    JobHeader #job { width: 1fr; padding: 0 1; }
    JobHeader #state { width: auto; padding: 0 1; text-style: bold; }
    JobHeader #state.live { color: $success; }
    JobHeader #state.connecting { color: $warning; }
    JobHeader #state.silent { color: $warning; }
    JobHeader #state.finished { color: $accent; }
    JobHeader #state.disconnected { color: $error; }
    JobHeader #state.replay { color: $accent; }
    """

    def __init__(self) -> None:
        super().__init__()
        self._snap: Snapshot | None = None

    def compose(self) -> ComposeResult:
        yield Static(BRAND, id="brand")
        yield Static("", id="job")
        yield Static("", id="state")

    def show(self, snap: Snapshot) -> None:
        self._snap = snap
        label, css_class = state_label(snap)
        state = self.query_one("#state", Static)
        state.update(label)
        state.set_classes(css_class)
        width = self.size.width
        room = width - (len(BRAND) + 2) - (cell_len(label) + 2) - 2 if width else None  # paddings
        self.query_one("#job", Static).update(job_line(snap, room))

    def on_resize(self) -> None:
        if self._snap is not None:
            self.show(self._snap)


def state_label(snap: Snapshot) -> tuple[str, str]:
    """The state at the header's right end, and its CSS class."""
    if snap.replay is not None:
        return ("▶ REPLAY" if snap.replay.playing else "‖ REPLAY"), "replay"
    if snap.silent_s is not None:
        return f"◌ SILENT {silence(snap.silent_s)}", "silent"
    return STATE_LABELS[snap.state], snap.state.value


def job_line(snap: Snapshot, room: int | None = None) -> str:
    """The job's line; in ``room`` cells, the least wanted parts are left out (DROPPED_FIRST)
    rather than cutting the line's end."""
    session = snap.session
    if session is None:
        return escape(snap.target)
    step = snap.latest.step if snap.latest else None
    parts = {  # plain text, in the order shown
        "name": session.name,
        "step": f"step {step:,}" if step is not None else "step n/a",
        "rank": f"rank {session.rank}/{session.world_size}" if session.world_size > 1 else "",
        "up": f"up {fmt.clock(snap.uptime_s)}",
        "host": session.host,
        "pid": f"pid {session.pid}",
    }
    shown = [key for key, text in parts.items() if text]
    for key in DROPPED_FIRST:
        if room is None or cell_len(SEPARATOR.join(parts[k] for k in shown)) <= room:
            break
        shown.remove(key)
    texts = [f"[b]{escape(parts[k])}[/b]" if k == "name" else escape(parts[k]) for k in shown]
    return SEPARATOR.join(texts)


def silence(seconds: float) -> str:
    """How long a job has been silent, whole seconds: 12s, 3m 05s."""
    return f"{int(seconds)}s" if seconds < 60 else fmt.duration(seconds)
