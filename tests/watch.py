"""Helpers for tests that watch a real job through its socket."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import psutil

from bsmon.probes.wire import discovery, protocol
from bsmon.probes.wire.client import JobConnection

from .helpers import wait_until


def job_socket(name: str, directory: Path, timeout: float = 90.0) -> Path:
    """The socket of the running job called ``name``, once it serves."""

    def find() -> Path | None:
        return next((j.socket for j in discovery.iter_jobs(directory) if j.name == name), None)

    return wait_until(find, timeout=timeout, interval=0.1, message=f"job {name!r} to serve")  # type: ignore[return-value]


def metrics_until(
    conn: JobConnection,
    condition: Callable[[protocol.Metrics], bool],
    timeout: float = 60.0,
    keep: list[protocol.Message] | None = None,
) -> protocol.Metrics:
    """The first metrics message that satisfies ``condition`` (the others are dropped, or
    appended to ``keep``); fails once ``timeout`` goes by with no message of a later step
    (the job stepping slowly on a busy machine is progress)."""
    last: list[protocol.Metrics] = []

    def wanted() -> protocol.Metrics | None:
        for message in conn.pump(0.2):
            if keep is not None:
                keep.append(message)
            if isinstance(message, protocol.Metrics):
                last[:] = [message]
                if condition(message):
                    return message
        return None

    return wait_until(  # type: ignore[return-value]
        wanted,
        timeout=timeout,
        interval=0,
        message=lambda: f"metrics as wanted; the last: {last[0] if last else None}",
        progress=lambda: last[0].step if last else None,
    )


def events_of(messages: list[protocol.Message]) -> list[protocol.Event]:
    return [m for m in messages if isinstance(m, protocol.Event)]


def run_processes(directory: Path, name: str | None = None) -> list[psutil.Process]:
    """Live processes that `bsmon run` started with sockets in ``directory`` (named ``name``).
    torchrun starts its workers in sessions of their own, so killing a test's process group
    does not reach them: tests kill these too."""
    found = []
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        ours = env.get("BSMON_DIR") == str(directory) and "BSMON_RUN" in env
        if ours and (name is None or env["BSMON_RUN"] == name):
            found.append(proc)
    return found


def kill_run_processes(directory: Path) -> None:
    for proc in run_processes(directory):
        with contextlib.suppress(psutil.Error):
            proc.kill()
