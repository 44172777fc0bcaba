"""The GPU seen from outside the job — nvidia-smi and NVML's per-process list — and the busy
training job the NVML and dashboard checks watch. Nothing here creates a CUDA context."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

from .procs import Children, read_json_line

MISSING = {"", "N/A", "[N/A]", "[Not Supported]", "Not Supported", "[Unknown Error]"}


def nvidia_smi(*args: str, timeout: float = 20.0) -> str:
    if shutil.which("nvidia-smi") is None:
        raise RuntimeError("nvidia-smi is not on PATH")
    done = subprocess.run(
        ["nvidia-smi", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"nvidia-smi {' '.join(args)}: {done.stdout.strip() or done.stderr}")
    return done.stdout


def query_gpu(uuid: str, fields: list[str]) -> dict[str, str | None]:
    """``nvidia-smi --query-gpu`` for the GPU with ``uuid``: raw values, None where n/a."""
    text = nvidia_smi(f"--query-gpu=uuid,{','.join(fields)}", "--format=csv,noheader,nounits")
    for line in text.splitlines():
        values = [v.strip() for v in line.split(",")]
        if values[0] == uuid:
            return {
                f: (None if v in MISSING else v) for f, v in zip(fields, values[1:], strict=True)
            }
    raise RuntimeError(f"nvidia-smi does not list {uuid}")


def number(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def compute_apps(uuid: str) -> list[dict[str, Any]]:
    """nvidia-smi's compute processes on ``uuid``: pid, name, used MiB."""
    text = nvidia_smi(
        "--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
        "--format=csv,noheader,nounits",
    )
    apps = []
    for line in text.splitlines():
        values = [v.strip() for v in line.split(",")]
        if len(values) == 4 and values[0] == uuid:
            apps.append({"pid": int(values[1]), "name": values[2], "used_mib": number(values[3])})
    return apps


class Nvml:
    """NVML in this process (it never creates a CUDA context)."""

    def __enter__(self) -> Nvml:
        import pynvml

        self.pynvml = pynvml
        pynvml.nvmlInit()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.pynvml.nvmlShutdown()

    def processes(self, uuid: str) -> dict[int, int | None]:
        """pid -> used bytes (None where NVML cannot say) of the compute processes on
        ``uuid``; the pids are the host's, which a container may not share."""
        handle = self.pynvml.nvmlDeviceGetHandleByUUID(uuid.encode())
        return {
            p.pid: (p.usedGpuMemory if isinstance(p.usedGpuMemory, int) else None)
            for p in self.pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        }


def start_busy_job(children: Children, seconds: float, batch: int = 1024) -> dict[str, Any]:
    """Start ``gpucheck.jobs busy``; returns its pid, socket and GPU uuid once it trains."""
    job = children.python(
        "-m", "gpucheck.jobs", "busy", "--seconds", str(seconds), "--batch", str(batch)
    )
    return read_json_line(job, timeout=90)
