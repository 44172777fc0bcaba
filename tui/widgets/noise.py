"""The gradient noise scale panel: the estimate once it exists, else why not."""

from __future__ import annotations

from textual.markup import escape
from textual.widgets import Static

from ..session import Snapshot


class NoisePanel(Static):
    DEFAULT_CSS = "NoisePanel { height: auto; }"

    def show(self, snap: Snapshot) -> None:
        cap = snap.noise_capability
        if cap is None:
            self.update("[$text-muted]waiting for the job…[/]")
        elif not cap.available:
            self.update(f"[$text-muted]B_simple: {escape(cap.reason or 'not enabled')}[/]")
        else:
            self.update("[$text-muted]B_simple: collecting…[/]")
