"""Device and host readings for the job, taken on the agent's sampler thread.

GPUs are the CUDA devices the job itself has initialised, matched to NVML handles by UUID so
``CUDA_VISIBLE_DEVICES`` renumbering cannot mix them up. Nothing here creates a CUDA context:
a job that has not touched CUDA is reported as running on the CPU. Every failure becomes a
``None`` reading plus a reason, never an exception.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol

import psutil

from ..wire.protocol import Capability, DeviceReading, HostReading

CPU_INTERVAL_S = 0.5  # the process's CPU share is read over at least this (10 ms ticks: ≤ 2%)


class CudaApi(Protocol):
    """The slice of ``torch.cuda`` the sampler uses (a test double can stand in)."""

    def is_available(self) -> bool: ...
    def is_initialized(self) -> bool: ...
    def device_count(self) -> int: ...
    def get_device_properties(self, device: int) -> Any: ...
    def memory_allocated(self, device: int) -> int: ...
    def memory_reserved(self, device: int) -> int: ...
    def max_memory_allocated(self, device: int) -> int: ...
    def memory_stats(self, device: int) -> dict[str, Any]: ...


def _torch_cuda() -> CudaApi:
    import torch

    return torch.cuda


def _cpu_only_reason() -> str:
    import torch

    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return f"torch {torch.__version__} is a CPU-only build"
    return "torch sees no CUDA device"


class Nvml:
    """Lazy, thread-safe NVML access; remembers why it is unavailable."""

    def __init__(self, module: ModuleType | Any | None = None) -> None:
        self._module = module
        self._lock = threading.Lock()
        self._ready = False
        self.unavailable: str | None = None

    def _init(self) -> bool:
        with self._lock:
            if self._ready or self.unavailable:
                return self._ready
            try:
                if self._module is None:
                    import pynvml

                    self._module = pynvml
                self._module.nvmlInit()
            except ImportError:
                self.unavailable = "NVML unavailable: nvidia-ml-py is not installed"
            except Exception as exc:
                self.unavailable = f"NVML unavailable: {_nvml_error_text(exc)}"
            else:
                self._ready = True
            return self._ready

    @property
    def module(self) -> Any:
        return self._module

    def available(self) -> bool:
        return self._init()

    def shutdown(self) -> None:
        with self._lock:
            if self._ready:
                with contextlib.suppress(Exception):
                    self._module.nvmlShutdown()
                self._ready = False


# NVML's clock event reasons (nvml.h: nvmlClocksEventReason*; the query's newer name first,
# older pynvml releases have only the other); the ones that slow a GPU that has work, in
# words. An idle GPU's, an application clock setting's and sync boost's are not a slowdown.
CLOCK_REASONS = (
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
)
SLOWDOWNS = (
    (0x4, "power cap"),
    (0x8, "hardware slowdown"),
    (0x20, "thermal (software)"),
    (0x40, "thermal (hardware)"),
    (0x80, "power brake"),
)
NVML_CLOCK_SM = 1


def throttle_reasons(mask: int) -> str | None:
    """The slowdowns in NVML's reasons ``mask``, in words; None when there are none."""
    said = [words for bit, words in SLOWDOWNS if mask & bit]
    return ", ".join(said) if said else None


def _nvml_error_text(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.removeprefix("NVMLError_")


@dataclass
class DeviceSample:
    devices: list[DeviceReading]
    gpu: Capability
    host: HostReading
    t: float = field(default_factory=time.time)


class DeviceSampler:
    """Reads the job's GPUs (NVML + torch allocator) and its process (psutil)."""

    def __init__(self, nvml: Nvml | None = None, cuda: CudaApi | None = None) -> None:
        self._nvml = nvml or Nvml()
        self._cuda = cuda
        self._process = psutil.Process()
        self._process.cpu_percent(None)  # the first call primes the counter
        self._cpu_since = time.monotonic()
        self._cpu: float | None = None  # the share over the last CPU_INTERVAL_S or more
        self._handles: dict[int, Any] = {}

    @property
    def cuda(self) -> CudaApi:
        if self._cuda is None:
            self._cuda = _torch_cuda()
        return self._cuda

    def sample(self) -> DeviceSample:
        gpu, devices = self._sample_gpus()
        return DeviceSample(devices=devices, gpu=gpu, host=self._sample_host())

    def close(self) -> None:
        self._nvml.shutdown()

    def _sample_host(self) -> HostReading:
        try:
            with self._process.oneshot():
                return HostReading(
                    cpu_percent=self._cpu_share(),
                    rss_bytes=self._process.memory_info().rss,
                    threads=self._process.num_threads(),
                )
        except (psutil.Error, OSError) as exc:
            return HostReading(error=f"psutil: {exc}")

    def _cpu_share(self) -> float | None:
        """The process's CPU % since the last reading at least ``CPU_INTERVAL_S`` ago (the
        last one meanwhile; None before the first). The kernel counts CPU time in 10 ms
        ticks: read 1.5 ms apart, psutil says 0% or 590–710% of a core; the first sample,
        taken just after the counter was primed, put a 7 s run's mean at 352% on 2 cores."""
        now = time.monotonic()
        if now - self._cpu_since >= CPU_INTERVAL_S:
            self._cpu = self._process.cpu_percent(None)
            self._cpu_since = now
        return self._cpu

    def _sample_gpus(self) -> tuple[Capability, list[DeviceReading]]:
        cuda = self.cuda
        try:
            if not cuda.is_available():
                return Capability(False, _cpu_only_reason()), []
            if not cuda.is_initialized():
                return Capability(False, "the job has not used CUDA yet (it runs on the CPU)"), []
            count = cuda.device_count()
        except Exception as exc:
            return Capability(False, f"CUDA query failed: {exc}"), []
        devices = [self._read_device(index) for index in range(count)]
        nvml_reason = None if self._nvml.available() else self._nvml.unavailable
        return Capability(True, nvml_reason), devices

    def _read_device(self, index: int) -> DeviceReading:
        cuda = self.cuda
        reading = DeviceReading(index=index)
        try:
            props = cuda.get_device_properties(index)
            reading.name = str(props.name)
            reading.uuid = _uuid_text(getattr(props, "uuid", ""))
            reading.memory_total_bytes = int(props.total_memory)
            reading.torch_allocated_bytes = int(cuda.memory_allocated(index))
            reading.torch_reserved_bytes = int(cuda.memory_reserved(index))
            reading.torch_peak_bytes = int(cuda.max_memory_allocated(index))
            _read_allocator_stats(cuda.memory_stats(index), reading)
        except Exception as exc:
            reading.error = f"torch.cuda: {exc}"
            return reading
        if self._nvml.available():
            self._read_nvml(index, reading)
        else:
            reading.error = self._nvml.unavailable
        return reading

    def _read_nvml(self, index: int, reading: DeviceReading) -> None:
        nvml = self._nvml.module
        try:
            handle = self._handles.get(index)
            if handle is None:
                handle = nvml.nvmlDeviceGetHandleByUUID(reading.uuid.encode())
                self._handles[index] = handle
        except Exception as exc:
            reading.error = f"NVML: no handle for {reading.uuid or f'device {index}'}: " + (
                _nvml_error_text(exc)
            )
            return
        failures: list[str] = []

        def query(fn: str, *args: Any) -> Any:
            try:
                return getattr(nvml, fn)(handle, *args)
            except Exception as exc:
                if "Not Supported" not in str(exc):
                    failures.append(f"{fn.removeprefix('nvmlDeviceGet')}: {_nvml_error_text(exc)}")
                return None

        util = query("nvmlDeviceGetUtilizationRates")
        memory = query("nvmlDeviceGetMemoryInfo")
        temperature = query("nvmlDeviceGetTemperature", 0)  # NVML_TEMPERATURE_GPU
        power_mw = query("nvmlDeviceGetPowerUsage")
        reading.util_percent = float(util.gpu) if util is not None else None
        if memory is not None:
            reading.memory_used_bytes = int(memory.used)
            reading.memory_total_bytes = int(memory.total)
        reading.temperature_c = float(temperature) if temperature is not None else None
        reading.power_w = power_mw / 1000.0 if power_mw is not None else None
        reasons_fn = next((f for f in CLOCK_REASONS if hasattr(nvml, f)), None)
        if reasons_fn is not None and (mask := query(reasons_fn)) is not None:
            reading.throttled = throttle_reasons(int(mask))
            if reading.throttled is not None:
                clock = query("nvmlDeviceGetClockInfo", NVML_CLOCK_SM)
                reading.sm_clock_mhz = float(clock) if clock is not None else None
        if failures:
            self._handles.pop(index, None)  # a lost GPU gets a fresh handle next time
            reading.error = "NVML: " + "; ".join(failures)


def _read_allocator_stats(stats: dict[str, Any], reading: DeviceReading) -> None:
    """The peak reserved bytes (what ``max_memory_reserved`` returns, from the same one
    ``memory_stats`` call) and the allocator's retries and OOMs; absent keys stay None."""
    peak = stats.get("reserved_bytes.all.peak")
    retries = stats.get("num_alloc_retries")
    ooms = stats.get("num_ooms")
    reading.torch_reserved_peak_bytes = int(peak) if peak is not None else None
    reading.alloc_retries = int(retries) if retries is not None else None
    reading.ooms = int(ooms) if ooms is not None else None


def _uuid_text(uuid: object) -> str:
    text = str(uuid)
    if not text:
        return ""
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"
