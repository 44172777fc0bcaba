"""bsmon.probes: everything that runs inside or beside the training job.

This package never imports textual or rich. The dashboard talks to a job through the wire
protocol (docs/protocol.md) and reads its record (docs/record.md); of this package it imports
only the faces tests/unit/test_layout.py lists in ``FACES`` (this module's ``__version__``, the
protocol, the record, the summary, ``bsmon run``'s launch, the units and the demo job).
``attach`` and ``Monitor`` are imported lazily so that the dashboard can use the faces
without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .version import __version__

if TYPE_CHECKING:
    from .agent import Monitor, attach

__all__ = ["Monitor", "__version__", "attach"]


def __getattr__(name: str) -> Any:
    if name in ("attach", "Monitor"):
        from . import agent

        return getattr(agent, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
