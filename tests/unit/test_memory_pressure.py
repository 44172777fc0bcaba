"""The allocator's retries and OOMs as warnings: once per device and counter, again on each
doubling, an OOM the guard already said not twice."""

from __future__ import annotations

from bsmon.probes.runtime.context import JobContext
from bsmon.probes.runtime.devices import DeviceSample
from bsmon.probes.runtime.fault_guard import FaultGuard
from bsmon.probes.runtime.memory_pressure import MemoryPressure
from bsmon.probes.runtime.progress import Progress
from bsmon.probes.runtime.service import TickDone
from bsmon.probes.wire.protocol import Capability, DeviceReading, Event, HostReading

GIB = 1 << 30


class Job:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.progress = Progress()
        guard = FaultGuard(self.events.append, self.progress)
        self.part = MemoryPressure(JobContext(self.progress, self.events.append, guard, None))

    def reading(self, step: int, retries: int, ooms: int = 0, guard_ooms: int = 0) -> list[Event]:
        """A fresh device sample at ``step``; the warnings it brought."""
        self.progress.step = step
        device = DeviceReading(
            index=0,
            memory_total_bytes=80 * GIB,
            torch_reserved_peak_bytes=int(77.6 * GIB),
            alloc_retries=retries,
            ooms=ooms,
        )
        sample = DeviceSample([device], Capability(True), HostReading())
        said = [Event(0.0, step, "oom", "out of memory at batch 512") for _ in range(guard_ooms)]
        before = len(self.events)
        self.part.after_tick(TickDone(0.0, said, sample, Capability(True), False))
        return self.events[before:]


def test_retries_warn_once_with_the_peak_reserved_share_then_again_on_each_doubling():
    job = Job()
    assert job.reading(0, 0) == []
    (first,) = job.reading(340, 12)
    assert first.level == "warning" and first.kind == "alloc_retries" and first.step == 340
    assert first.message.startswith("cudaMalloc retries on GPU 0: 12 in the last 340 steps — ")
    assert "memory is near full (peak reserved 97% of 80.0 GiB)" in first.message
    assert first.data["reserved_peak_fraction"] == 0.97 and first.data["new"] == 12
    assert job.reading(400, 20) == job.reading(500, 23) == []  # under twice 12
    (again,) = job.reading(540, 24)
    assert "12 in the last 200 steps (24 in all)" in again.message
    assert job.reading(600, 47) == []


def test_counts_from_before_the_first_reading_are_said_so_far():
    (first,) = Job().reading(50, 5)
    assert "GPU 0: 5 so far —" in first.message


def test_a_job_that_resets_its_statistics_is_warned_again_from_there():
    job = Job()
    job.reading(0, 0)
    assert len(job.reading(10, 4)) == 1
    assert job.reading(20, 0) == []
    (again,) = job.reading(30, 1)
    assert "1 in the last 10 steps" in again.message


def test_an_oom_the_job_survived_warns_and_one_the_guard_said_does_not():
    job = Job()
    job.reading(0, 0)
    (survived,) = job.reading(100, 0, ooms=1)
    assert survived.kind == "alloc_oom"
    assert "out of memory on GPU 0: 1 error in the last 100 steps" in survived.message
    assert job.reading(200, 0, ooms=2, guard_ooms=1) == []  # bsmon's guard said this one
    (unsaid,) = job.reading(300, 0, ooms=3)  # the next one the guard did not say
    assert "1 error in the last 100 steps (3 in all)" in unsaid.message
    assert job.reading(400, 0, ooms=5) == []
    (doubled,) = job.reading(500, 0, ooms=6)
    assert "3 errors in the last 200 steps (6 in all)" in doubled.message


def test_the_same_sample_is_judged_once_and_a_cpu_job_says_nothing():
    job = Job()
    job.reading(0, 0)
    job.reading(10, 3)
    done = TickDone(0.0, [], job.part._seen, Capability(True), False)
    job.part.after_tick(done)
    assert len(job.events) == 1
    cpu = DeviceSample([], Capability(False, "CPU-only build"), HostReading())
    job.part.after_tick(TickDone(0.0, [], cpu, Capability(True), False))
    assert len(job.events) == 1


def test_an_attached_job_whose_allocator_retries_gets_the_warning_once(bsmon_dir, monkeypatch):
    """The wiring: attach() builds the part; a fake allocator that starts retrying warns once
    on the job's events (the real sampler thread, a fake CUDA)."""
    from bsmon.probes import attach
    from bsmon.probes.agent import assemble
    from bsmon.probes.runtime.devices import DeviceSampler, Nvml

    from ..fakes import FakeCuda, FakeGpu, FakeNvml
    from ..helpers import wait_until
    from ..jobs import TinyJob

    gpu = FakeGpu(reserved_peak=int(77.6 * GIB))
    monkeypatch.setattr(
        assemble, "DeviceSampler", lambda: DeviceSampler(Nvml(FakeNvml([gpu])), FakeCuda([gpu]))
    )
    job = TinyJob()
    with attach(
        job.model, job.optimizer, batch_size=8, record=False, sample_interval_s=0.02
    ) as mon:

        def warnings() -> list[Event]:
            job.step(mon)
            mon.flush()
            return [e for e in mon.job.telemetry.events if e.kind == "alloc_retries"]

        wait_until(lambda: mon._service.sampler.latest.devices, message="a device reading")
        gpu.alloc_retries = 5
        (warning,) = wait_until(
            warnings, message="the alloc_retries warning", progress=lambda: mon.step
        )
        for _ in range(5):  # more readings at the same count: no second warning
            job.step(mon)
        wait_until(lambda: mon._service.sampler.latest.devices[0].alloc_retries == 5)
        assert len(warnings()) == 1
    assert (
        "cudaMalloc retries on GPU 0: 5" in warning.message and "97% of 80.0 GiB" in warning.message
    )
