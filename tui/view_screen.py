"""A full screen that follows the job's snapshots beside the dashboard (ranks, time)."""

from __future__ import annotations

from textual.screen import Screen

from .session import Snapshot
from .widgets.header import JobHeader


class ViewScreen(Screen[None]):
    """Shows the snapshot it opened with, then each one the dashboard passes to ``show``."""

    def __init__(self, snapshot: Snapshot | None = None) -> None:
        super().__init__()
        self._first = snapshot

    def on_mount(self) -> None:
        if self._first is not None:
            self.show(self._first)

    def show(self, snap: Snapshot) -> None:
        self.query_one(JobHeader).show(snap)
        self.show_view(snap)

    def show_view(self, snap: Snapshot) -> None:
        raise NotImplementedError

    def action_close(self) -> None:
        self.dismiss(None)
