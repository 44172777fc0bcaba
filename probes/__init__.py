"""bsmon.probes: everything that runs inside or beside the training job.

This package never imports textual or rich; the dashboard talks to it only through the
wire protocol (see docs/protocol.md). ``attach`` and ``Monitor`` are imported lazily so that
the dashboard can use the protocol modules without importing torch.
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
