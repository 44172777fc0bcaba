"""The dashboard's panels; each renders from a ``Snapshot`` in ``show()`` (``Panel``)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..session import Snapshot


@runtime_checkable
class Panel(Protocol):
    """A panel of the main screen (``classes="panel"``): it draws itself from a snapshot."""

    def show(self, snap: Snapshot) -> None: ...
