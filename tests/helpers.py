"""Helpers for tests: condition waits that count progress, and child processes that are always
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


# The last resort of a wait that sees progress: a loaded machine needs far less, and a wait
# whose work goes on while its condition never comes still ends.
PATIENCE_S = 600.0


def wait_until(
    condition: Callable[[], object],
    timeout: float = 60.0,
    interval: float = 0.02,
    message: str | Callable[[], str] = "condition",
    progress: Callable[[], object] | None = None,
) -> object:
    """Poll ``condition`` until it is truthy; fail the test with ``message`` when it is not.

    ``timeout`` is how long the wait may go without progress. Given ``progress`` (a reading
    that changes while the work goes on: a job's step, its output, a screen), each change
    starts ``timeout`` again, up to ``PATIENCE_S`` in all: a machine whose other jobs slow
    the work down does not fail a test whose work still advances."""
    start = last_change = time.monotonic()
    seen = progress() if progress is not None else None
    while True:
        value = condition()
        if value:
            return value
        now = time.monotonic()
        if progress is not None and (current := progress()) != seen:
            seen, last_change = current, now
        if now - last_change > timeout or now - start > PATIENCE_S:
            said = message() if callable(message) else message
            if now - last_change <= timeout:
                pytest.fail(f"gave up after {now - start:.0f}s (progress and all) for {said}")
            stalled = " with no progress" if progress is not None else ""
            pytest.fail(f"timed out after {now - last_change:.1f}s{stalled} waiting for {said}")
        time.sleep(interval)


def repeat_until(
    work: Callable[[], object],
    condition: Callable[[], object],
    at_most: int,
    message: str | Callable[[], str],
    at_least_s: float = 60.0,
) -> int:
    """Do ``work`` (some training steps on this thread) until ``condition()`` holds; returns
    how many times it was done. For a condition that needs the work done and also time on
    another thread (the agent's ticks, a sampler's interval): it fails only once ``at_most``
    rounds of work *and* ``at_least_s`` seconds have gone by, so that neither a loaded
    machine (few steps a second) nor a fast one (many steps before the agent's clock comes
    round) fails a job that would get there."""
    patience = Patience(at_most, at_least_s)
    rounds = 0
    while not condition():
        if patience.spent(rounds):
            said = message() if callable(message) else message
            pytest.fail(f"not done after {rounds} rounds in {patience.elapsed():.0f}s: {said}")
        work()
        rounds += 1
    return rounds


class Patience:
    """When a test that drives the work itself (steps, epochs) gives up: past ``at_most``
    rounds *and* ``at_least_s`` seconds, or ``PATIENCE_S`` in all (see ``repeat_until``)."""

    def __init__(self, at_most: int, at_least_s: float = 60.0) -> None:
        self.at_most, self.at_least_s = at_most, at_least_s
        self.start = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def spent(self, rounds: int) -> bool:
        elapsed = self.elapsed()
        return (rounds >= self.at_most and elapsed > self.at_least_s) or elapsed > PATIENCE_S


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


def interruptible() -> None:
    """Ctrl-C as an interactive shell leaves it (a ``preexec_fn``): a shell running the suite
    in the background (``pytest &``, nohup, CI runners) starts every command with SIGINT
    ignored, a Python started so never raises KeyboardInterrupt, and bsmon rightly passes
    that on to the script."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
