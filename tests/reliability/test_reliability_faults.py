"""Faults around a running job: monitors SIGKILLed while attached, the socket file deleted,
NVML failing mid-run. The job never stops, and no sample it made is lost."""

from __future__ import annotations

import subprocess

import pytest

from bsmon.probes import attach
from bsmon.probes.agent import assemble as agent
from bsmon.probes.runtime.devices import DeviceSampler, Nvml
from bsmon.probes.summary.build import summarize_record
from bsmon.probes.wire import discovery, protocol
from bsmon.probes.wire.client import JobConnection
from workloads.reliability_kit import JobProcess, kill_attached_monitors

from ..fakes import FakeCuda, FakeGpu, FakeNvml
from ..helpers import wait_until
from ..jobs import TinyJob


@pytest.fixture
def start(processes):
    return lambda args: processes.start(args, stdin=subprocess.PIPE, text=True)


def test_a_hundred_monitors_killed_while_attached_lose_the_job_nothing(bsmon_dir, start):
    job = JobProcess(start, "killed-monitors", "--sleep", "0.001")
    socket = job.wait_ready()
    assert kill_attached_monitors(start, socket, 100) == 100
    steps_after_kills = job.steps()
    wait_until(
        lambda: job.steps() > steps_after_kills + 50,
        message="the job to step on",
        progress=job.steps,
    )
    with JobConnection(socket) as conn:
        assert conn.hello().session.name == "killed-monitors"
        assert conn.request(protocol.Ping()).ok
    done = job.stop()
    assert done.bsmon_samples == done.samples and done.bsmon_errors == 0
    recorded = summarize_record(done.record)
    assert recorded.samples == done.samples and recorded.steps == done.steps


def test_a_deleted_socket_is_made_again_and_attached_monitors_stay(bsmon_dir):
    job = TinyJob()
    with attach(job.model, job.optimizer, batch_size=8, name="rebind", record=False) as mon:
        with JobConnection(mon.socket_path) as attached:
            attached.hello()
            discovery.remove_job_files(mon.socket_path)  # a tmp cleaner, or a stray rm
            wait_until(mon.socket_path.exists, message="the socket to come back")
            job.step(mon)
            event = attached.wait_for(protocol.Event, timeout=10)
            while event.kind != "socket_rebound":
                event = attached.wait_for(protocol.Event, timeout=10)
            assert "was deleted; bsmon made it again" in event.message
            assert attached.request(protocol.Ping()).ok
            with JobConnection(mon.socket_path) as later:
                assert later.hello().step == 1
            assert [j.name for j in discovery.iter_jobs(bsmon_dir)] == ["rebind"]
        assert mon.step == 1 and mon.stats()["errors"] == 0


def test_nvml_failing_mid_run_is_na_with_its_reason_and_the_job_steps_on(bsmon_dir, monkeypatch):
    gpu = FakeGpu()
    monkeypatch.setattr(
        agent, "DeviceSampler", lambda: DeviceSampler(Nvml(FakeNvml([gpu])), FakeCuda([gpu]))
    )
    job = TinyJob()
    mon = attach(job.model, job.optimizer, batch_size=8, record=False, sample_interval_s=0.02)
    with mon, JobConnection(mon.socket_path) as conn:

        def device_now() -> protocol.DeviceReading:
            job.step(mon)
            metrics = conn.wait_for(protocol.Metrics, timeout=10)
            return metrics.devices[0] if metrics.devices else None

        wait_until(lambda: (d := device_now()) and d.util_percent == 87.0, message="a reading")
        gpu.failing = {
            name: "GPU is lost"
            for name in (
                "nvmlDeviceGetUtilizationRates",
                "nvmlDeviceGetMemoryInfo",
                "nvmlDeviceGetTemperature",
                "nvmlDeviceGetPowerUsage",
            )
        }
        lost = wait_until(lambda: (d := device_now()) and d.error and d, message="n/a")
        assert lost.util_percent is None and lost.memory_used_bytes is None
        assert "GPU is lost" in lost.error
        assert lost.torch_allocated_bytes == 30 << 30  # what torch still knows stays
        before = mon.step
        for _ in range(10):
            job.step(mon)
        assert mon.step == before + 10 and mon.stats()["errors"] == 0
