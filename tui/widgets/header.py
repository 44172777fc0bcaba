"""The one-line header: job, host, pid, uptime, step and connection state."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.markup import escape
from textual.widgets import Static

from .. import format as fmt
from ..session import ConnState, Snapshot

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

    def compose(self) -> ComposeResult:
        yield Static("bsmon", id="brand")
        yield Static("", id="job")
        yield Static("", id="state")

    def show(self, snap: Snapshot) -> None:
        self.query_one("#job", Static).update(job_line(snap))
        state = self.query_one("#state", Static)
        if snap.replay is not None:
            state.update("▶ REPLAY" if snap.replay.playing else "‖ REPLAY")
            state.set_classes("replay")
            return
        if snap.silent_s is not None:
            state.update(f"◌ SILENT {silence(snap.silent_s)}")
            state.set_classes("silent")
            return
        state.update(STATE_LABELS[snap.state])
        state.set_classes(snap.state.value)


def job_line(snap: Snapshot) -> str:
    session = snap.session
    if session is None:
        return escape(snap.target)
    step = snap.latest.step if snap.latest else None
    parts = [  # most wanted first: a narrow terminal cuts the end of the line
        f"[b]{escape(session.name)}[/b]",
        f"step {step:,}" if step is not None else "step n/a",
        f"up {fmt.clock(snap.uptime_s)}",
        escape(session.host),
        f"pid {session.pid}",
    ]
    if session.world_size > 1:
        parts.insert(2, f"rank {session.rank}/{session.world_size}")
    return " · ".join(parts)


def silence(seconds: float) -> str:
    """How long a job has been silent, whole seconds: 12s, 3m 05s."""
    return f"{int(seconds)}s" if seconds < 60 else fmt.duration(seconds)
