"""The dashboard never creates a CUDA context.

A busy CUDA job runs with bsmon attached; ``bsmon attach SOCKET`` runs in a pseudo-terminal
beside it until its screen shows ``LIVE``. While it runs, NVML's per-process list (and
nvidia-smi's) must show the job and not the dashboard; the number of processes on the GPU must
not change; and the dashboard's process must not have the CUDA driver library mapped at all.
The last two hold where a container's pids differ from the host's, which NVML reports.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import sys
import termios
import threading
import time
from pathlib import Path

import psutil

from .outside import Nvml, compute_apps, start_busy_job
from .procs import Children, Deadline
from .report import Criterion, Finding, Table

ANSI = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)|\x1b[@-_]")
CUDA_LIBRARIES = ("libcuda.so", "libcudart", "libtorch_cuda")
SAMPLES = 6
SAMPLE_SPACING_S = 0.5


class Terminal:
    """A command in a pseudo-terminal of ``size`` (columns, rows); its output is kept."""

    def __init__(self, children: Children, args: list[str], size: tuple[int, int] = (120, 40)):
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", size[1], size[0], 0, 0))
        env = {
            **os.environ,
            "TERM": "xterm-256color",
            "COLUMNS": str(size[0]),
            "LINES": str(size[1]),
        }
        self.process = children.start(args, stdin=slave, stdout=slave, stderr=slave, env=env)
        os.close(slave)
        self._master = master
        self._output = bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._master, 65536)
            except OSError:  # EIO once the command has exited
                return
            if not chunk:
                return
            self._output += chunk
            del self._output[: -(1 << 20)]

    def text(self) -> str:
        return ANSI.sub(b"", bytes(self._output)).decode(errors="replace")

    def wait_for(self, needle: str, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end and self.process.poll() is None:
            if needle in self.text():
                return True
            time.sleep(0.1)
        return needle in self.text()

    def send(self, data: bytes) -> None:
        os.write(self._master, data)

    def close(self) -> None:
        os.close(self._master)


def process_tree(pid: int) -> set[int]:
    try:
        root = psutil.Process(pid)
        return {pid, *(c.pid for c in root.children(recursive=True))}
    except psutil.Error:
        return {pid}


def cuda_libraries(pids: set[int]) -> list[str]:
    """The CUDA libraries mapped into any of ``pids`` (a CUDA context needs libcuda)."""
    found = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        for line in maps.splitlines():
            path = line.rsplit(" ", 1)[-1]
            found.update(f"{pid}: {Path(path).name}" for lib in CUDA_LIBRARIES if lib in path)
    return sorted(found)


def run(deadline: Deadline) -> Finding:
    with Children() as children, Nvml() as nvml:
        job = start_busy_job(children, seconds=deadline.remaining())
        uuid, job_pid = job["uuid"], job["pid"]
        before = nvml.processes(uuid)
        term = Terminal(children, [sys.executable, "-m", "bsmon.tui.cli", "attach", job["socket"]])
        try:
            live = term.wait_for("LIVE", timeout=min(40.0, deadline.remaining() - 10))
            dashboard = process_tree(term.process.pid)
            seen: list[dict[int, int | None]] = []
            libraries: set[str] = set()
            for _ in range(SAMPLES):
                seen.append(nvml.processes(uuid))
                libraries.update(cuda_libraries(dashboard))
                time.sleep(SAMPLE_SPACING_S)
            try:
                apps: list[dict] | str = compute_apps(uuid)
            except RuntimeError as exc:  # NVML's list above is the one judged
                apps = str(exc)
            job_libraries = cuda_libraries({job_pid})
            term.send(b"q")
            try:
                quit_code: int | None = children.wait(term.process, 10)
            except TimeoutError:
                quit_code = None
        finally:
            term.close()
    return judge(
        live, job_pid, dashboard, before, seen, sorted(libraries), job_libraries, apps, quit_code
    )


def judge(
    live: bool,
    job_pid: int,
    dashboard: set[int],
    before: dict[int, int | None],
    seen: list[dict[int, int | None]],
    libraries: list[str],
    job_libraries: list[str],
    apps: list[dict] | str,
    quit_code: int | None,
) -> Finding:
    visible = job_pid in before
    on_gpu = sorted({pid for sample in seen for pid in sample} & dashboard)
    counts = sorted({len(sample) for sample in seen})
    criteria = [
        Criterion(
            "the dashboard attached to the CUDA job",
            "LIVE on its screen" if live else "never showed LIVE",
            "LIVE",
            live,
        ),
        Criterion(
            "the job is in NVML's process list (the control)",
            f"pid {job_pid}: {before[job_pid] / 2**20:.0f} MiB"
            if visible and before[job_pid]
            else (
                "listed"
                if visible
                else "not listed: NVML reports other pids (a container's PID namespace)"
            ),
            "listed",
            True if visible else None,
        ),
        Criterion(
            "the dashboard's processes in NVML's process list",
            ", ".join(map(str, on_gpu)) if on_gpu else f"none of {sorted(dashboard)}",
            "none",
            not on_gpu if visible else None,
        ),
        Criterion(
            "processes on the GPU while the dashboard ran",
            f"{'/'.join(map(str, counts))} (before: {len(before)})",
            f"{len(before)}, as before it started",
            counts == [len(before)],
        ),
        Criterion(
            "CUDA libraries mapped in the dashboard's processes",
            ", ".join(libraries) if libraries else "none",
            "none (no libcuda, so no context)",
            not libraries,
        ),
        Criterion(
            "CUDA libraries mapped in the job (the control)",
            ", ".join(job_libraries) if job_libraries else "none",
            "found (the same test sees them where they are)",
            bool(job_libraries),
        ),
        Criterion(
            "the dashboard quit on q",
            f"exit code {quit_code}"
            if quit_code is not None
            else "still running after 10 s (killed)",
            "exit code 0",
            quit_code == 0,
        ),
    ]
    notes = [f"nvidia-smi's list is missing: {apps}"] if isinstance(apps, str) else []
    rows = [
        [
            str(app["pid"]),
            app["name"],
            f"{app['used_mib']:.0f} MiB" if app["used_mib"] is not None else "n/a",
            "the job"
            if app["pid"] == job_pid
            else "the dashboard"
            if app["pid"] in dashboard
            else "other",
        ]
        for app in (apps if isinstance(apps, list) else [])
    ]
    failed = [c.what for c in criteria if c.ok is False]
    return Finding(
        summary="no CUDA context in the dashboard" if not failed else f"off: {failed[0]}",
        criteria=criteria,
        tables=[
            Table(
                ["pid", "process", "GPU memory", "role"],
                rows,
                title="nvidia-smi --query-compute-apps while the dashboard ran",
            )
        ],
        figures={
            "dashboard_pids": sorted(dashboard),
            "job_pid": job_pid,
            "pids_visible": visible,
            "processes_before": len(before),
            "process_counts_during": counts,
            "cuda_libraries": libraries,
        },
        notes=notes,
    )
