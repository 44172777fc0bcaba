"""Memory pressure as torchtitan reports it: a warning when the CUDA caching allocator retries
``cudaMalloc`` (it freed its cache to satisfy an allocation, which stalls the step) or raised
an out-of-memory error the job survived. Decided here, on the agent thread, from the device
samples; every surface shows these events.

Each counter of each GPU warns once when it first counts, and again only when it has doubled
since the last warning: a job that retries every step says so a few times, not every second.
An OOM that bsmon's own guard recovered from is said by the guard's ``oom`` event, not twice.
"""

from __future__ import annotations

import dataclasses

from .. import units
from ..wire.protocol import DeviceReading
from .context import JobContext
from .devices import DeviceSample
from .service import Extension, TickDone

GUARD_OOM_KIND = "oom"  # batch/oom_recovery's event: that OOM is said already


@dataclasses.dataclass
class CounterWatch:
    """One allocator counter of one device: the count and step at the last warning (or at the
    first reading, when it read 0) and the count that warns next."""

    count: int | None = None  # at the latest reading
    since_count: int = 0
    since_step: int | None = None  # None: the counting began before bsmon's first reading
    warns_at: int = 1

    def grown(self, count: int, step: int) -> tuple[int, int | None] | None:
        """``(new counts, over how many steps or None)`` when ``count`` warns now."""
        first = self.count is None
        if first and count == 0:
            self.since_step = step
        if self.count is not None and count < self.count:  # the job reset its statistics
            self.since_count, self.since_step, self.warns_at = count, step, max(1, 2 * count)
        self.count = count
        if count < self.warns_at:
            return None
        new = count - self.since_count
        steps = step - self.since_step if self.since_step is not None else None
        self.since_count, self.since_step, self.warns_at = count, step, 2 * count
        return new, steps

    def absorb(self, count: int, step: int) -> None:
        """Counts already said elsewhere (the guard's OOMs): the next warning starts here."""
        self.count = self.since_count = count
        self.since_step = step
        self.warns_at = max(self.warns_at, count + 1)


class MemoryPressure(Extension):
    """Warns of the allocator's retries and OOMs per device, from each new device sample."""

    def __init__(self, ctx: JobContext) -> None:
        self._ctx = ctx
        self._seen: DeviceSample | None = None
        self._retries: dict[int, CounterWatch] = {}
        self._ooms: dict[int, CounterWatch] = {}
        self._guard_ooms = 0  # OOMs the guard said and no reading has counted yet

    def after_tick(self, done: TickDone) -> None:
        self._guard_ooms += sum(1 for event in done.events if event.kind == GUARD_OOM_KIND)
        if done.sample is self._seen:
            return
        self._seen = done.sample
        step = self._ctx.progress.step
        for device in done.sample.devices:
            self._observe(device, step)

    def _observe(self, device: DeviceReading, step: int) -> None:
        if device.alloc_retries is not None:
            watch = self._retries.setdefault(device.index, CounterWatch())
            if (grown := watch.grown(device.alloc_retries, step)) is not None:
                self._warn("alloc_retries", device, grown, device.alloc_retries, step)
        if device.ooms is not None:
            self._observe_ooms(device, device.ooms, step)

    def _observe_ooms(self, device: DeviceReading, count: int, step: int) -> None:
        watch = self._ooms.setdefault(device.index, CounterWatch())
        before = watch.count or 0
        if self._guard_ooms and count > before:
            said = min(self._guard_ooms, count - before)
            self._guard_ooms -= said
            watch.absorb(count, step)
            return
        if (grown := watch.grown(count, step)) is not None:
            self._warn("alloc_oom", device, grown, count, step)

    def _warn(
        self,
        kind: str,
        device: DeviceReading,
        grown: tuple[int, int | None],
        count: int,
        step: int,
    ) -> None:
        new, steps = grown
        self._ctx.warn(
            kind,
            pressure_message(kind, device, new, steps, count),
            step=step,
            data={
                "device": device.index,
                "count": count,
                "new": new,
                "steps": steps,
                "reserved_peak_fraction": reserved_peak_fraction(device),
            },
        )


def reserved_peak_fraction(device: DeviceReading) -> float | None:
    peak, total = device.torch_reserved_peak_bytes, device.memory_total_bytes
    return round(peak / total, 4) if peak and total else None


def pressure_message(
    kind: str, device: DeviceReading, new: int, steps: int | None, count: int
) -> str:
    """The warning's words, e.g. ``cudaMalloc retries on GPU 0: 12 in the last 340 steps — …``."""
    when = f"in the last {units.count(steps)} steps" if steps else "so far"
    total = f" ({units.count(count)} in all)" if new != count else ""
    fraction = reserved_peak_fraction(device)
    full = (
        f"peak reserved {units.percent(100 * fraction)} of "
        f"{units.bytes_(device.memory_total_bytes)}"
        if fraction is not None
        else "peak reserved n/a"
    )
    if kind == "alloc_retries":
        return (
            f"cudaMalloc retries on GPU {device.index}: {units.count(new)} {when}{total} — the "
            "allocator is freeing its cache to satisfy allocations, which stalls steps; memory "
            f"is near full ({full})"
        )
    errors = "error" if new == 1 else "errors"
    return (
        f"out of memory on GPU {device.index}: {units.count(new)} {errors} {when}{total} that "
        f"the job caught and went on from ({full}); a smaller batch leaves headroom"
    )
