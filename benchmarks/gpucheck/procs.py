"""Child processes that are always cleaned up, a deadline, and JSON lines from children.

A check starts jobs, trials and the dashboard as children; ``Children`` kills every one of
them and every descendant it has seen (the probe's sidecar runs in a session of its own, so
a process-group kill alone would miss it), also when the check fails or runs out of time.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

BENCHMARKS = Path(__file__).resolve().parent.parent
ROOT = BENCHMARKS.parent
POLL_S = 0.2


class OutOfTime(Exception):
    """A check's deadline passed before it could finish a step."""


@dataclass
class Deadline:
    budget_s: float
    started: float = field(default_factory=time.monotonic)

    def remaining(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def require(self, seconds: float, what: str) -> float:
        """The time left, or OutOfTime when less than ``seconds`` is left for ``what``."""
        left = self.remaining()
        if left < seconds:
            raise OutOfTime(
                f"{left:.0f} s left of the {self.budget_s:.0f} s budget; {what} skipped"
            )
        return left


def child_env(**extra: str) -> dict[str, str]:
    """This environment with ``benchmarks/`` importable (``gpucheck``, ``overhead``, ...)."""
    env = dict(os.environ)
    paths = [str(BENCHMARKS), *filter(None, [env.get("PYTHONPATH")])]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(extra)
    return env


class Children:
    """Starts child processes and kills them, with their descendants, on ``close``."""

    def __init__(self) -> None:
        self.started: list[tuple[subprocess.Popen, bool]] = []
        self._seen: dict[int, psutil.Process] = {}

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def start(self, args: list[str], **kwargs: Any) -> subprocess.Popen:
        kwargs.setdefault("env", child_env())
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        kwargs.setdefault("stdout", subprocess.PIPE)
        process = subprocess.Popen(args, **kwargs)
        self.started.append((process, bool(kwargs.get("start_new_session"))))
        return process

    def python(self, *args: str, **kwargs: Any) -> subprocess.Popen:
        return self.start([sys.executable, *args], **kwargs)

    def track(self) -> None:
        """Remember every live descendant, so it can be killed after its parent is gone."""
        for process, _ in self.started:
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(process.pid).children(recursive=True):
                    self._seen.setdefault(child.pid, child)

    def wait(self, process: subprocess.Popen, timeout: float) -> int:
        """Wait for ``process`` to exit; TimeoutError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            self.track()
            code = process.poll()
            if code is not None:
                return code
            if time.monotonic() > deadline:
                raise TimeoutError(f"still running after {timeout:.0f} s")
            time.sleep(POLL_S)

    def close(self) -> None:
        self.track()
        for process, own_group in self.started:
            if own_group:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
            if process.poll() is None:
                process.kill()
        for child in self._seen.values():
            with contextlib.suppress(psutil.Error):
                if child.is_running():  # also checks that the pid was not reused
                    child.kill()
        wait_gone(list(self._seen.values()), timeout=10)
        for process, _ in self.started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)
            for stream in (process.stdin, process.stdout, process.stderr):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()


def wait_gone(processes: list[psutil.Process], timeout: float) -> None:
    """Wait until each process has exited (a zombie counts: it holds no memory)."""
    deadline = time.monotonic() + timeout
    for process in processes:
        while time.monotonic() < deadline:
            try:
                if not process.is_running() or process.status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.02)


def read_json_line(process: subprocess.Popen, timeout: float) -> dict[str, Any]:
    """The first line of ``process``'s stdout that is a JSON object (other lines are
    skipped); RuntimeError when it exits or ``timeout`` passes first."""
    assert process.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    try:
        while (left := deadline - time.monotonic()) > 0:
            if not selector.select(min(left, 1.0)):
                continue
            line = process.stdout.readline()
            if not line:
                break
            with contextlib.suppress(ValueError):
                message = json.loads(line)
                if isinstance(message, dict):
                    return message
    finally:
        selector.close()
    code = process.poll()
    state = f"exited with code {code}" if code is not None else f"said nothing in {timeout:.0f} s"
    raise RuntimeError(f"{' '.join(map(str, process.args[1:4]))}: {state}")  # type: ignore[index]


def run_json(children: Children, args: list[str], timeout: float) -> dict[str, Any]:
    """Run ``python ARGS`` to the end and return the last JSON object it printed."""
    process = children.python(*args)
    try:
        children.wait(process, timeout)
    except TimeoutError:
        process.kill()
        raise RuntimeError(f"{' '.join(args[:4])}: still running after {timeout:.0f} s") from None
    assert process.stdout is not None
    out = process.stdout.read().decode(errors="replace").splitlines()
    for line in reversed(out):
        with contextlib.suppress(ValueError):
            message = json.loads(line)
            if isinstance(message, dict):
                return message
    raise RuntimeError(f"{' '.join(args[:4])}: exited with code {process.returncode}, no result")
