"""The CPU sidecar's memory: its peak resident memory during a step (the probe's measure on
the CPU), and a cap that makes an allocation far over the budget fail as out of memory."""

from __future__ import annotations

import os
import resource
import threading

PAGE = os.sysconf("SC_PAGE_SIZE")
HEADROOM = 64 << 20  # thread stacks and small arenas, whatever the cap


def resident_and_virtual() -> tuple[int, int]:
    """(resident, virtual) bytes of this process."""
    with open("/proc/self/statm", "rb") as f:
        virtual, resident = f.read().split()[:2]
    return int(resident) * PAGE, int(virtual) * PAGE


class PeakRss:
    """Samples this process's resident memory every half millisecond while active; on the
    CPU that is the probe's measure of a step's peak (the sidecar runs with glibc returning
    large blocks to the OS, so RSS follows live memory)."""

    def __init__(self, interval_s: float = 0.0005) -> None:
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.peak = 0

    def current(self) -> int:
        return resident_and_virtual()[0]

    def __enter__(self) -> PeakRss:
        self.peak = self.current()
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="peak-rss", daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(self._interval):
            self.peak = max(self.peak, self.current())

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.peak = max(self.peak, self.current())


def cap_allocations(resident_limit: int) -> None:
    """Let an allocation that would take resident memory past ``resident_limit`` fail (the
    CPU allocator's "can't allocate memory", an out-of-memory error), instead of growing until
    the job's watchdog kills the sidecar and the whole probe with it: a soft address-space
    limit at the present virtual size plus what is left under the limit."""
    resident, virtual = resident_and_virtual()
    soft = virtual + max(HEADROOM, resident_limit - resident)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
