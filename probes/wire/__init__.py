"""The wire: what crosses the job's Unix socket, and how each side finds and speaks to it.

Modules, one job each:

- ``protocol``: the messages and commands, version 1 (NDJSON; docs/protocol.md);
- ``discovery``: where jobs put their sockets, and how a monitor finds them;
- ``client``: a small blocking client (the dashboard, the CLI and tests use it);
- ``describe``: readings in words, for every client and for the job's own events;
- ``server``: the agent's socket server (many clients, nothing reaches the job);
- ``routing``: a client's command decoded, routed to a handler, always answered;
- ``pacing``: a cap on the share of time the agent spends serving.

This package is the dashboard's face on the job: it imports neither torch nor textual.
The dashboard imports this package and ``protocol``, never the server side.
"""

from __future__ import annotations

from . import discovery, protocol
from .client import ConnectionLost, JobConnection
from .describe import (
    BALANCED,
    RAISE,
    TOO_BIG,
    TOO_EARLY,
    batch_varies,
    describe_advice,
    describe_prediction,
    describe_recommendation,
    describe_what_if,
    noise_verdict,
    step_batch,
)
from .discovery import BsmonDirError, JobEntry

__all__ = [
    "BALANCED",
    "RAISE",
    "TOO_BIG",
    "TOO_EARLY",
    "BsmonDirError",
    "ConnectionLost",
    "JobConnection",
    "JobEntry",
    "batch_varies",
    "describe_advice",
    "describe_prediction",
    "describe_recommendation",
    "describe_what_if",
    "discovery",
    "noise_verdict",
    "protocol",
    "step_batch",
]
