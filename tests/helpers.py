"""Helpers for tests: condition waits with deadlines, and child processes that are always
cleaned up, even when a test fails."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def wait_until(
    condition: Callable[[], object],
    timeout: float = 10.0,
    interval: float = 0.02,
    message: str = "condition",
) -> object:
    """Poll ``condition`` until it is truthy; fail the test with ``message`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.1f}s waiting for {message}")
        time.sleep(interval)


class Processes:
    """Starts child processes in their own process groups and kills every one at teardown."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def start(self, args: list[str], **kwargs: object) -> subprocess.Popen:
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        process = subprocess.Popen(args, start_new_session=True, **kwargs)  # type: ignore[call-overload]
        self.started.append(process)
        return process

    def python(self, *args: str, **kwargs: object) -> subprocess.Popen:
        return self.start([sys.executable, *args], **kwargs)

    def cleanup(self) -> None:
        for process in self.started:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                process.wait(10)
            for stream in (process.stdout, process.stderr):
                if stream is not None:
                    stream.close()
