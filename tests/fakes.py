"""Stand-ins for NVML and torch.cuda, so the GPU code paths run on machines without a GPU."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace


class FakeNVMLError(Exception):
    pass


@dataclass
class FakeGpu:
    uuid: str = "GPU-0000"
    name: str = "Fake H100"
    util: int = 87
    used: int = 40 << 30
    total: int = 80 << 30
    temperature: int = 71
    power_mw: int = 312_000
    reserved_peak: int = 38 << 30
    alloc_retries: int = 0
    ooms: int = 0
    clock_reasons: int = 0  # NVML's clock event reasons bitmask (0x1: idle)
    sm_clock_mhz: int = 1980
    failing: dict[str, str] = field(default_factory=dict)  # NVML function -> error text


class FakeNvml:
    def __init__(self, gpus: list[FakeGpu], init_error: str | None = None) -> None:
        self.gpus = {gpu.uuid: gpu for gpu in gpus}
        self.init_error = init_error
        self.initialised = False

    def nvmlInit(self) -> None:
        if self.init_error:
            raise FakeNVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlDeviceGetHandleByUUID(self, uuid: bytes) -> FakeGpu:
        try:
            return self.gpus[uuid.decode()]
        except KeyError:
            raise FakeNVMLError("Not Found") from None

    def _call(self, name: str, gpu: FakeGpu, value: object) -> object:
        if name in gpu.failing:
            raise FakeNVMLError(gpu.failing[name])
        return value

    def nvmlDeviceGetUtilizationRates(self, gpu: FakeGpu) -> object:
        return self._call(
            "nvmlDeviceGetUtilizationRates", gpu, SimpleNamespace(gpu=gpu.util, memory=0)
        )

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu) -> object:
        return self._call(
            "nvmlDeviceGetMemoryInfo",
            gpu,
            SimpleNamespace(used=gpu.used, total=gpu.total, free=gpu.total - gpu.used),
        )

    def nvmlDeviceGetTemperature(self, gpu: FakeGpu, _sensor: int) -> object:
        return self._call("nvmlDeviceGetTemperature", gpu, gpu.temperature)

    def nvmlDeviceGetPowerUsage(self, gpu: FakeGpu) -> object:
        return self._call("nvmlDeviceGetPowerUsage", gpu, gpu.power_mw)

    def nvmlDeviceGetCurrentClocksEventReasons(self, gpu: FakeGpu) -> object:
        return self._call("nvmlDeviceGetCurrentClocksEventReasons", gpu, gpu.clock_reasons)

    def nvmlDeviceGetClockInfo(self, gpu: FakeGpu, _clock: int) -> object:
        return self._call("nvmlDeviceGetClockInfo", gpu, gpu.sm_clock_mhz)


class FakeCuda:
    def __init__(
        self, gpus: list[FakeGpu], initialised: bool = True, available: bool = True
    ) -> None:
        self.gpus = gpus
        self.initialised = initialised
        self.available = available
        self.stats_read = 0  # memory_stats calls

    def is_available(self) -> bool:
        return self.available

    def is_initialized(self) -> bool:
        return self.initialised

    def device_count(self) -> int:
        return len(self.gpus)

    def get_device_properties(self, index: int) -> object:
        gpu = self.gpus[index]
        return SimpleNamespace(
            name=gpu.name, uuid=gpu.uuid.removeprefix("GPU-"), total_memory=gpu.total
        )

    def memory_allocated(self, index: int) -> int:
        return 30 << 30

    def memory_reserved(self, index: int) -> int:
        return 36 << 30

    def max_memory_allocated(self, index: int) -> int:
        return 34 << 30

    def memory_stats(self, index: int) -> dict[str, int]:
        self.stats_read += 1
        gpu = self.gpus[index]
        return {
            "reserved_bytes.all.peak": gpu.reserved_peak,
            "num_alloc_retries": gpu.alloc_retries,
            "num_ooms": gpu.ooms,
        }
