"""Device readings: every GPU path has a no-GPU answer with a reason, never an exception."""

from __future__ import annotations

import pytest
import torch

from bsmon.probes.runtime.devices import DeviceSampler, Nvml

from ..fakes import FakeCuda, FakeGpu, FakeNvml


def test_readings_from_nvml_and_the_torch_allocator():
    gpu = FakeGpu()
    sample = DeviceSampler(Nvml(FakeNvml([gpu])), FakeCuda([gpu])).sample()
    assert sample.gpu.available and sample.gpu.reason is None
    (device,) = sample.devices
    assert device.name == "Fake H100" and device.uuid == "GPU-0000"
    assert device.util_percent == 87.0 and device.temperature_c == 71.0 and device.power_w == 312.0
    assert device.memory_used_bytes == 40 << 30 and device.memory_total_bytes == 80 << 30
    assert (device.torch_allocated_bytes, device.torch_reserved_bytes, device.torch_peak_bytes) == (
        30 << 30,
        36 << 30,
        34 << 30,
    )
    assert device.error is None
    assert sample.host.rss_bytes and sample.host.rss_bytes > 0


def test_no_nvml_library_leaves_torch_readings_and_says_why():
    gpu = FakeGpu()
    nvml = Nvml(FakeNvml([gpu], init_error="NVML Shared Library Not Found"))
    sample = DeviceSampler(nvml, FakeCuda([gpu])).sample()
    (device,) = sample.devices
    assert device.util_percent is None and device.torch_allocated_bytes == 30 << 30
    assert "NVML unavailable: NVML Shared Library Not Found" in device.error
    assert sample.gpu.available and "NVML unavailable" in sample.gpu.reason


def test_a_failing_nvml_field_is_na_with_its_reason_and_unsupported_is_silent():
    gpu = FakeGpu(
        failing={
            "nvmlDeviceGetPowerUsage": "Not Supported",
            "nvmlDeviceGetTemperature": "GPU is lost",
        }
    )
    (device,) = DeviceSampler(Nvml(FakeNvml([gpu])), FakeCuda([gpu])).sample().devices
    assert device.power_w is None and device.temperature_c is None
    assert device.util_percent == 87.0
    assert device.error == "NVML: Temperature: GPU is lost"


def test_a_gpu_nvml_cannot_find_is_reported_not_raised():
    gpu = FakeGpu(uuid="GPU-abcd")
    other = FakeGpu(uuid="GPU-ffff")
    (device,) = DeviceSampler(Nvml(FakeNvml([other])), FakeCuda([gpu])).sample().devices
    assert "no handle for GPU-abcd" in device.error
    assert device.torch_reserved_bytes == 36 << 30


def test_a_job_that_has_not_used_cuda_runs_on_the_cpu():
    gpu = FakeGpu()
    nvml = FakeNvml([gpu])
    sample = DeviceSampler(Nvml(nvml), FakeCuda([gpu], initialised=False)).sample()
    assert not sample.gpu.available and "has not used CUDA" in sample.gpu.reason
    assert sample.devices == []
    assert not nvml.initialised  # NVML is not even touched


def test_this_machine_without_a_gpu_gives_a_reason():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    sample = DeviceSampler().sample()
    assert not sample.gpu.available and sample.gpu.reason
    assert sample.devices == []


def test_torch_cuda_raising_is_a_reason_too():
    class Broken(FakeCuda):
        def device_count(self) -> int:
            raise RuntimeError("driver went away")

    sample = DeviceSampler(Nvml(FakeNvml([])), Broken([FakeGpu()])).sample()
    assert not sample.gpu.available and "driver went away" in sample.gpu.reason


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_real_gpu_readings_and_cuda_event_step_times(bsmon_dir):
    from bsmon.probes import attach

    model = torch.nn.Linear(1024, 1024).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, optimizer, batch_size=256, sample_interval_s=0.2) as mon:
        for _ in range(50):
            loss = model(torch.randn(256, 1024, device="cuda")).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            mon.log(loss=loss)
        torch.cuda.synchronize()
        import time

        time.sleep(0.5)
        assert mon.flush()
        stats = mon.stats()
        sample = mon._service.sampler.latest
    assert stats["step"] == 50 and stats["step_time_s"] > 0 and stats["scalars"]["loss"] > 0
    assert sample.gpu.available
    device = sample.devices[0]
    assert device.torch_allocated_bytes > 0 and device.memory_total_bytes > 0
    if sample.gpu.reason is None:
        assert device.util_percent is not None and device.memory_used_bytes > 0


def test_the_cpu_share_is_read_over_half_a_second_or_more(monkeypatch):
    """The kernel counts CPU time in 10 ms ticks: the first sample, taken a moment after the
    counter was primed, read a tick or none over a few ms (0% or ~600% of a core). The share
    is unknown until half a second has passed, then the share over that time, kept until
    the next reading half a second later."""
    from bsmon.probes.runtime import devices

    now = [100.0]
    monkeypatch.setattr(devices.time, "monotonic", lambda: now[0])
    sampler = DeviceSampler(Nvml(FakeNvml([])), FakeCuda([]))
    assert sampler.sample().host.cpu_percent is None
    now[0] += devices.CPU_INTERVAL_S
    first = sampler.sample().host.cpu_percent
    assert first is not None and first >= 0.0
    now[0] += 0.05  # too soon to read again: the last share stays
    assert sampler.sample().host.cpu_percent == first


def test_the_periodic_sampler_samples_at_once_when_asked_and_stops():
    """Its interval is a minute here: a second sample within the deadline is the one asked
    for (the autopilot asks as soon as a new batch size has run)."""
    from bsmon.probes.runtime.service import PeriodicSampler

    from ..helpers import wait_until

    sampler = PeriodicSampler(DeviceSampler(), interval_s=60.0)
    sampler.start()
    try:
        first = wait_until(lambda: sampler.latest.host.rss_bytes and sampler.latest, 10)
        sampler.sample_soon()
        wait_until(lambda: sampler.latest is not first, 10, message="the sample asked for")
        assert sampler.latest.t > first.t and sampler.latest.host.rss_bytes
    finally:
        sampler.stop()
        sampler.join(10)
    assert not sampler.is_alive()


def test_the_allocators_peak_reserved_retries_and_ooms_are_read_from_one_stats_call():
    gpu = FakeGpu(reserved_peak=77 << 30, alloc_retries=12, ooms=1)
    cuda = FakeCuda([gpu])
    (device,) = DeviceSampler(Nvml(FakeNvml([gpu])), cuda).sample().devices
    assert device.torch_reserved_peak_bytes == 77 << 30
    assert (device.alloc_retries, device.ooms) == (12, 1)
    assert cuda.stats_read == 1


def test_no_allocator_statistics_are_read_before_the_job_uses_cuda():
    gpu = FakeGpu(alloc_retries=3)
    cuda = FakeCuda([gpu], initialised=False)
    sample = DeviceSampler(Nvml(FakeNvml([gpu])), cuda).sample()
    assert sample.devices == [] and cuda.stats_read == 0


def test_a_torch_without_the_allocator_counters_leaves_them_na():
    class Bare(FakeCuda):
        def memory_stats(self, index: int) -> dict[str, int]:
            return {}

    (device,) = DeviceSampler(Nvml(FakeNvml([FakeGpu()])), Bare([FakeGpu()])).sample().devices
    assert device.torch_reserved_peak_bytes is None and device.alloc_retries is None
    assert device.torch_reserved_bytes == 36 << 30 and device.error is None


@pytest.mark.parametrize(
    ("mask", "said"),
    [
        (0x0, None),
        (0x1, None),  # idle: not a slowdown
        (0x4, "power cap"),
        (0x4 | 0x40 | 0x10, "power cap, thermal (hardware)"),  # sync boost is not one either
    ],
)
def test_nvml_says_when_the_clocks_are_held_down_and_at_what_clock(mask, said):
    gpu = FakeGpu(clock_reasons=mask, sm_clock_mhz=1410)
    (device,) = DeviceSampler(Nvml(FakeNvml([gpu])), FakeCuda([gpu])).sample().devices
    assert device.throttled == said
    assert device.sm_clock_mhz == (1410.0 if said else None)
    assert device.error is None
