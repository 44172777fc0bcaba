"""Helpers for tests that watch a real job through its socket."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from bsmon.probes import discovery, protocol
from bsmon.probes.client import JobConnection

from .helpers import wait_until


def job_socket(name: str, directory: Path, timeout: float = 90.0) -> Path:
    """The socket of the running job called ``name``, once it serves."""

    def find() -> Path | None:
        return next((j.socket for j in discovery.iter_jobs(directory) if j.name == name), None)

    return wait_until(find, timeout=timeout, interval=0.1, message=f"job {name!r} to serve")  # type: ignore[return-value]


def metrics_until(
    conn: JobConnection, condition: Callable[[protocol.Metrics], bool], timeout: float = 60.0
) -> protocol.Metrics:
    """The first metrics message that satisfies ``condition`` (others are dropped)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        for message in conn.pump(0.2):
            if isinstance(message, protocol.Metrics):
                last = message
                if condition(message):
                    return message
    raise AssertionError(f"no metrics as wanted within {timeout:.0f}s; the last: {last}")


def events_of(messages: list[protocol.Message]) -> list[protocol.Event]:
    return [m for m in messages if isinstance(m, protocol.Event)]
