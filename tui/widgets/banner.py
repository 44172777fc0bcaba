"""A banner above the panels for every state that is not plain "live"."""

from __future__ import annotations

from pathlib import PurePath

from textual.markup import escape
from textual.widgets import Static

from .. import format as fmt
from ..session import ConnState, ReplayState, Snapshot
from .header import silence


class StateBanner(Static):
    DEFAULT_CSS = """
    StateBanner { height: auto; padding: 0 1; display: none; }
    StateBanner.connecting { display: block; background: $warning-muted; }
    StateBanner.silent { display: block; background: $warning-muted; }
    StateBanner.disconnected { display: block; background: $error-muted; }
    StateBanner.finished { display: block; background: $accent-muted; }
    StateBanner.replay { display: block; background: $primary-muted; }
    """

    def show(self, snap: Snapshot) -> None:
        if snap.replay is not None:
            self.set_classes("replay")
            self.update(replay_text(snap.replay))
            return
        if snap.silent_s is not None:
            self.set_classes("silent")
            self.update(silent_text(snap.silent_s))
            return
        self.set_classes(snap.state.value)
        if snap.state is ConnState.DISCONNECTED:
            text = (
                f"⚠ disconnected: {escape(snap.detail)} — showing the last data; "
                "reconnecting when the job comes back"
            )
        elif snap.state is ConnState.FINISHED:
            text = f"■ {escape(snap.detail)} — showing the final data"
        elif snap.state is ConnState.CONNECTING:
            text = f"◌ {escape(snap.detail)}"
        else:
            text = ""
        self.update(text)


def silent_text(seconds: float) -> str:
    return (
        f"◌ silent {silence(seconds)}: the job sends nothing — stopped, hung, or busy in a long "
        "call (a live job sends a message every second); showing the last data"
    )


def replay_text(replay: ReplayState) -> str:
    mark = "▶" if replay.playing else "‖"
    where = f"{fmt.clock(replay.position_s)} / {fmt.clock(replay.duration_s)}"
    name = escape(PurePath(replay.path).name)
    text = f"{mark} replay of {name} · {where} · ×{replay.speed:.3g}"
    if replay.ended:
        text += f" — {escape(replay.ended)}"
    return text
