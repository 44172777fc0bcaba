"""Is there a GPU to check, and what is it: NVML and torch, read without a CUDA context."""

from __future__ import annotations

import os
import platform
import socket
import sys


def no_gpu_reason() -> str | None:
    """Why there is nothing to check here (no NVML, no GPU, no CUDA torch), or None."""
    try:
        import pynvml
    except ImportError:
        return "nvidia-ml-py is not installed, so NVML cannot be read"
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return f"NVML is not loadable ({exc})"
    try:
        count = pynvml.nvmlDeviceGetCount()
    except Exception as exc:
        return f"NVML cannot count the GPUs ({exc})"
    finally:
        pynvml.nvmlShutdown()
    if count == 0:
        return "NVML sees no GPU"
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a build without CUDA"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    return None


def describe() -> dict[str, str]:
    """The machine in a few lines for the report (NVML, torch, bsmon, Python, host)."""
    import pynvml
    import torch

    from bsmon.probes import __version__

    pynvml.nvmlInit()
    try:
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            total = pynvml.nvmlDeviceGetMemoryInfo(handle).total
            gpus.append(f"{index}: {_text(name)} ({total / 2**30:.0f} GiB)")
        info = {
            "GPUs": "; ".join(gpus),
            "driver": f"{_text(pynvml.nvmlSystemGetDriverVersion())} (CUDA {cuda // 1000}."
            f"{cuda % 1000 // 10})",
        }
    finally:
        pynvml.nvmlShutdown()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return {
        **info,
        "CUDA_VISIBLE_DEVICES": visible if visible is not None else "(not set)",
        "torch": f"{torch.__version__} (CUDA {torch.version.cuda})",
        "bsmon": __version__,
        "Python": sys.version.split()[0],
        "host": f"{socket.gethostname()}, {platform.platform()}, {os.cpu_count()} CPUs",
    }


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
