"""A banner above the panels for every state that is not plain "live"."""

from __future__ import annotations

from textual.markup import escape
from textual.widgets import Static

from ..session import ConnState, Snapshot


class StateBanner(Static):
    DEFAULT_CSS = """
    StateBanner { height: auto; padding: 0 1; display: none; }
    StateBanner.connecting { display: block; background: $warning-muted; }
    StateBanner.disconnected { display: block; background: $error-muted; }
    StateBanner.finished { display: block; background: $accent-muted; }
    """

    def show(self, snap: Snapshot) -> None:
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
