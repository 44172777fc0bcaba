"""Which socket ``bsmon run`` opens: the one its command's process family serves, rank 0's.

torchrun starts its workers at about the same time, and rank 1 may serve before rank 0. The
dashboard follows the first socket it is given, and only rank 0 gathers the ranks view, so
``JobFinder`` waits for rank 0 (``RANK`` in the worker's environment, or a process without
it) for up to ``RANK0_WAIT_S`` after another rank served, then takes the lowest rank.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from bsmon.probes.wire import discovery

RANK0_WAIT_S = 60.0


def rank_of(pid: int) -> int | None:
    """The ``RANK`` torchrun gave process ``pid`` (None: none, or not readable)."""
    import psutil

    with contextlib.suppress(psutil.Error, ValueError):
        return int(psutil.Process(pid).environ().get("RANK", ""))
    return None


def family_of(pid: int) -> set[int]:
    import psutil

    family = {pid}
    with contextlib.suppress(psutil.Error):
        family |= {child.pid for child in psutil.Process(pid).children(recursive=True)}
    return family


def pick(
    jobs: Iterable[discovery.JobEntry], ranks: dict[int, int | None], name: str
) -> tuple[discovery.JobEntry | None, bool]:
    """The job to open and whether it is rank 0 (or a job without ranks): rank 0 first, then
    the one named ``name``, then the lowest pid."""

    def order(job: discovery.JobEntry) -> tuple[int, bool, int]:
        return (ranks.get(job.pid) or 0, job.name != name, job.pid)

    best = min(jobs, key=order, default=None)
    return best, best is not None and not ranks.get(best.pid)


class JobFinder:
    """Called again and again (the dashboard's resolve): the socket to open, or None."""

    def __init__(
        self,
        pid: int,
        name: str,
        directory: Path,
        *,
        rank0_wait_s: float = RANK0_WAIT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pid, self.name, self.directory = pid, name, directory
        self.rank0_wait_s = rank0_wait_s
        self.clock = clock
        self.other_rank_since: float | None = None  # when a rank other than 0 first served
        self.waiting_for_rank0 = False

    def __call__(self) -> Path | None:
        family = family_of(self.pid)
        jobs = [job for job in discovery.iter_jobs(self.directory) if job.pid in family]
        best, rank0 = pick(jobs, {job.pid: rank_of(job.pid) for job in jobs}, self.name)
        self.waiting_for_rank0 = False
        if best is None or rank0:
            return best.socket if best else None
        now = self.clock()
        if self.other_rank_since is None:
            self.other_rank_since = now
        if now - self.other_rank_since < self.rank0_wait_s:
            self.waiting_for_rank0 = True
            return None
        return best.socket
