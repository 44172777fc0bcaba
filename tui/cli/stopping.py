"""Stopping a job's process group the way a terminal user expects: Ctrl-C first (SIGINT, so the
script can save what it must), then SIGTERM, then SIGKILL, each after a grace period, or at
once when asked again (a second Ctrl-C).

``wait_for`` is ``bsmon run``'s wait for its job once the dashboard has closed: stopping it
(``q``, Ctrl-C, a signal sent to ``bsmon run``) or only waiting (``d`` detached), with Ctrl-C
and SIGTERM climbing the ladder and a hang-up leaving the job running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence

LADDER = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)
GRACE_S = 10.0
POLL_S = 0.2  # a signal handler may move the deadline while we wait


class GroupStop:
    """Sends the next rung of the ladder to ``process``'s group (the process leads its own
    session) each time ``escalate`` is called; ``wait_once`` escalates by itself after
    ``grace_s``."""

    def __init__(self, process: subprocess.Popen, name: str, grace_s: float = GRACE_S) -> None:
        self.process = process
        self.name = name
        self.grace_s = grace_s
        self.rung = -1  # the index of the last signal sent
        self.deadline: float | None = None

    def escalate(self, signum: int | None = None) -> None:
        """Send ``signum`` (one that came from outside: the ladder goes on from it), else the
        next signal; nothing once the process has ended or SIGKILL was sent."""
        if self.process.poll() is not None or self.rung + 1 >= len(LADDER):
            return
        sent = signal.Signals(signum) if signum is not None else LADDER[self.rung + 1]
        if sent in LADDER:
            self.rung = max(self.rung, LADDER.index(sent))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sent)
        self.deadline = time.monotonic() + self.grace_s
        then = ""
        if self.rung + 1 < len(LADDER):
            then = f"; {LADDER[self.rung + 1].name} in {self.grace_s:g} s, or at Ctrl-C"
        what = "Ctrl-C (SIGINT)" if sent == signal.SIGINT else sent.name
        print(f"bsmon: stopping {self.name}: {what} sent{then}", file=sys.stderr)

    def wait_once(self) -> int:
        """The return code if the process ends within ``POLL_S`` (else ``TimeoutExpired``),
        escalating first if a deadline has passed."""
        try:
            return self.process.wait(POLL_S)
        except subprocess.TimeoutExpired:
            if self.deadline is not None and time.monotonic() >= self.deadline:
                self.escalate()
            raise


@contextlib.contextmanager
def signals_handled(handler: Callable[[int], None], signums: Sequence[int]) -> Iterator[None]:
    """``handler(signum)`` for each of ``signums`` inside the block; the old handlers after."""
    previous = {signum: signal.signal(signum, lambda s, _f: handler(s)) for signum in signums}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def wait_for(
    process: subprocess.Popen, name: str, *, first: int | None, grace_s: float = GRACE_S
) -> int | None:
    """The job's return code once it ends. ``first``: the signal that starts stopping it now
    (SIGINT for ``q``/Ctrl-C, or the one sent to ``bsmon run``); None only waits. Ctrl-C and
    SIGTERM climb the ladder; a hang-up returns None at once (the job goes on)."""
    stop = GroupStop(process, name, grace_s)
    hung_up: list[int] = []

    def on_signal(signum: int) -> None:
        if signum == signal.SIGHUP:
            hung_up.append(signum)
        else:
            stop.escalate()

    with signals_handled(on_signal, (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)):
        if first is not None:
            stop.escalate(first)
        while not hung_up:
            with contextlib.suppress(subprocess.TimeoutExpired):
                return stop.wait_once()
    return None
