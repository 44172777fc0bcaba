"""Driving ``reliability_job.py`` (beside this file) and the processes that disturb it; shared
by the reliability tests and benchmarks/reliability.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

JOB_SCRIPT = Path(__file__).with_name("reliability_job.py")
Start = Callable[[list[str]], subprocess.Popen]

# A monitor at its simplest: connect, read until the first metrics line, say so, read on.
ATTACHED_MONITOR = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(20)
s.connect(sys.argv[1])
seen = b""
while b'"type":"metrics"' not in seen:
    chunk = s.recv(1 << 16)
    if not chunk:
        sys.exit("closed before metrics")
    seen = seen[-64:] + chunk
print("attached", flush=True)
while s.recv(1 << 16):
    pass
"""


@dataclass
class Done:
    steps: int
    samples: int
    bsmon_samples: int
    bsmon_errors: int
    record: Path | None


class JobProcess:
    """tests/reliability_job.py in a child process, its stdout read on a thread."""

    def __init__(self, start: Start, name: str, *args: str) -> None:
        self.process = start([sys.executable, str(JOB_SCRIPT), name, *args])
        self.socket: Path | None = None
        self.record: Path | None = None
        self.progress: list[tuple[float, int]] = []  # (unix time, steps)
        self.done: Done | None = None
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:  # type: ignore[union-attr]
            parts = line.split()
            if not line.endswith("\n") or not parts:
                continue
            if parts[0] == "ready":
                self.socket, self.record = (None if p == "-" else Path(p) for p in parts[1:3])
                self._ready.set()
            elif parts[0] == "t":
                self.progress.append((float(parts[1]), int(parts[2])))
            elif parts[0] == "done":
                record = None if parts[5] == "-" else Path(parts[5])
                self.done = Done(*map(int, parts[1:5]), record)  # type: ignore[arg-type]
        self._ready.set()

    def wait_ready(self, timeout: float = 60) -> Path | None:
        if not self._ready.wait(timeout) or self.process.poll() is not None:
            raise RuntimeError(f"the job did not start: {self.process.stderr.read()}")  # type: ignore[union-attr]
        return self.socket

    def steps(self) -> int:
        return self.progress[-1][1] if self.progress else 0

    def rate_since(self, t0: float) -> float:
        """Steps per second from the first report at or after ``t0`` to the latest."""
        points = [p for p in self.progress if p[0] >= t0]
        if len(points) < 2:
            return 0.0
        (ta, sa), (tb, sb) = points[0], points[-1]
        return (sb - sa) / (tb - ta)

    def stop(self, timeout: float = 60) -> Done:
        """Ask the job to finish (a line on stdin) and return its final counts."""
        self.process.stdin.write("stop\n")  # type: ignore[union-attr]
        self.process.stdin.flush()  # type: ignore[union-attr]
        self.process.wait(timeout)
        self._reader.join(10)
        if self.done is None:
            raise RuntimeError(f"the job ended without its counts: {self.process.stderr.read()}")  # type: ignore[union-attr]
        return self.done


def kill_attached_monitors(start: Start, socket: Path, count: int, batch: int = 20) -> int:
    """Attach ``count`` monitors, ``batch`` at a time, and SIGKILL each once it is reading
    metrics. Returns how many were attached when killed."""
    killed = 0
    while killed < count:
        monitors = [
            start([sys.executable, "-S", "-c", ATTACHED_MONITOR, str(socket)])
            for _ in range(min(batch, count - killed))
        ]
        for monitor in monitors:
            if monitor.stdout.readline().strip() != "attached":  # type: ignore[union-attr]
                raise RuntimeError(f"a monitor did not attach: {monitor.stderr.read()}")  # type: ignore[union-attr]
        for monitor in monitors:
            monitor.kill()
            monitor.wait(10)
            killed += 1
    return killed


def raw_client(path: os.PathLike[str], timeout: float | None = 10) -> socket.socket:
    """A client that speaks no protocol: a connected Unix socket and nothing more."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(os.fspath(path))
    return sock


def read_to_eof(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(1 << 16):
        data += chunk
    return data
