"""Textual messages that carry the data flow from source threads to the screens."""

from __future__ import annotations

from textual.message import Message

from .sources import Update


class SnapshotArrived(Message):
    """A source produced a new snapshot (and maybe replies to commands)."""

    def __init__(self, update: Update) -> None:
        super().__init__()
        self.update = update
