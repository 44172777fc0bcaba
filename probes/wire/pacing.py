"""A cap on the share of time the agent thread spends serving clients.

The agent thread shares the job's interpreter lock, so a client that floods the socket (bad
lines without pause, connect-and-close in a loop) would take the job's time. The server asks
``pace()`` before it accepts or reads more; while the agent thread's CPU time is over its share
of the time passed, that waits in the event loop (the lock released), and the kernel holds the
flood back. A monitor's few commands a second never come near it.
"""

from __future__ import annotations

import asyncio
import time

SHARE = 0.2  # of one core, at most, over any stretch (the agent's own work is far below)
BURST_S = 0.05  # CPU time allowed at once before pacing starts


class WorkBudget:
    """Paces the thread that calls it (it reads ``time.thread_time``), from its first call."""

    def __init__(self, share: float = SHARE, burst_s: float = BURST_S) -> None:
        self.share = share
        self.burst_s = burst_s
        self.waited_s = 0.0  # how long pacing has held clients back, in all
        self._debt = 0.0
        self._wall = self._cpu = None  # type: float | None

    def wait_s(self) -> float:
        """How long to wait before more work keeps within the share (0: go on)."""
        wall, cpu = time.monotonic(), time.thread_time()
        if self._wall is not None and self._cpu is not None:
            used, allowed = cpu - self._cpu, (wall - self._wall) * self.share
            self._debt = max(0.0, self._debt + used - allowed)
        self._wall, self._cpu = wall, cpu
        return max(0.0, self._debt - self.burst_s) / self.share

    async def pace(self) -> None:
        if (wait := self.wait_s()) > 0:
            self.waited_s += wait
            await asyncio.sleep(wait)
