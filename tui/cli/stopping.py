"""Stopping a job's process group the way a terminal user expects: Ctrl-C first (SIGINT, so the
script can save what it must), then SIGTERM, then SIGKILL, each after a grace period, or at
once when asked again (a second Ctrl-C)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

LADDER = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)
GRACE_S = 10.0
POLL_S = 0.2  # a signal handler may move the deadline while we wait


class GroupStop:
    """Sends the next rung of the ladder to ``process``'s group (the process leads its own
    session) each time ``escalate`` is called; ``wait`` escalates by itself after ``grace_s``."""

    def __init__(self, process: subprocess.Popen, name: str, grace_s: float = GRACE_S) -> None:
        self.process = process
        self.name = name
        self.grace_s = grace_s
        self.rung = -1  # the index of the last signal sent
        self.deadline: float | None = None

    def escalate(self) -> None:
        """Send the next signal (none once the process has ended or SIGKILL was sent)."""
        if self.process.poll() is not None or self.rung + 1 >= len(LADDER):
            return
        self.rung += 1
        sent = LADDER[self.rung]
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sent)
        self.deadline = time.monotonic() + self.grace_s
        then = ""
        if self.rung + 1 < len(LADDER):
            then = f"; {LADDER[self.rung + 1].name} in {self.grace_s:g} s, or at Ctrl-C"
        what = "Ctrl-C (SIGINT)" if sent == signal.SIGINT else sent.name
        print(f"bsmon: stopping {self.name}: {what} sent{then}", file=sys.stderr)

    def wait(self) -> int:
        """The process's return code, escalating whenever a deadline passes."""
        while True:
            try:
                return self.process.wait(POLL_S)
            except subprocess.TimeoutExpired:
                if self.deadline is not None and time.monotonic() >= self.deadline:
                    self.escalate()
