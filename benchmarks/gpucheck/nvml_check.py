"""NVML readings as the agent reports them, against nvidia-smi read at the same moments.

A busy training job (bsmon attached, devices sampled every 0.2 s) keeps the GPU working. This
check connects to its socket like a dashboard and, at each moment, takes the devices of the
newest ``metrics`` message and at once runs ``nvidia-smi --query-gpu``. It also holds the
torch allocator figures the agent reports against NVML's count of the job's own memory.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bsmon.probes.wire.client import JobConnection
from bsmon.probes.wire.protocol import DeviceReading, Metrics

from .outside import Nvml, number, query_gpu, start_busy_job
from .procs import Children, Deadline
from .report import Criterion, Finding, Table

MOMENTS = 10
SPACING_S = 1.0
MIB = 2**20
GIB = 2**30
SMI_FIELDS = ["utilization.gpu", "memory.used", "memory.total", "temperature.gpu", "power.draw"]


def run(deadline: Deadline) -> Finding:
    with Children() as children, Nvml() as nvml:
        job = start_busy_job(children, seconds=deadline.remaining())
        with JobConnection(job["socket"]) as conn:
            moments = collect(conn, job, nvml, deadline)
        try:
            reserved = number(query_gpu(job["uuid"], ["memory.reserved"])["memory.reserved"])
        except RuntimeError:
            reserved = None  # an older driver: no such field
    if not moments:
        why = job.get("last") or "no metrics message with devices"
        return Finding(summary="no readings", reason=f"the agent reported no GPU reading: {why}")
    return judge(moments, reserved, job["uuid"])


def newest_devices(conn: JobConnection, seconds: float) -> tuple[Metrics | None, float]:
    """The newest metrics message with devices over ``seconds``, and when it arrived."""
    newest, arrived = None, 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for message in conn.pump(0.05):
            if isinstance(message, Metrics) and message.devices:
                newest, arrived = message, time.monotonic()
    return newest, arrived


def collect(
    conn: JobConnection, job: dict[str, Any], nvml: Nvml, deadline: Deadline
) -> list[dict[str, Any]]:
    moments: list[dict[str, Any]] = []
    while len(moments) < MOMENTS and deadline.remaining() > 5:
        metrics, arrived = newest_devices(conn, SPACING_S)
        if metrics is None or metrics.devices[0].util_percent is None:
            if metrics is not None:  # the job is warming up, or NVML fails in the agent
                job["last"] = metrics.gpu.reason or metrics.devices[0].error
            continue
        smi = query_gpu(job["uuid"], SMI_FIELDS)
        lag = time.monotonic() - arrived
        device = next((d for d in metrics.devices if d.uuid == job["uuid"]), metrics.devices[0])
        moments.append(
            {
                "agent": device,
                "gpu": metrics.gpu,
                "smi": {k: number(v) for k, v in smi.items()},
                "process_used": nvml.processes(job["uuid"]).get(job["pid"], -1),
                "lag_s": lag,
            }
        )
    return moments


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _gib(value: float | None) -> str:
    return f"{value / GIB:.2f} GiB" if value is not None else "n/a"


def gap(
    moments: list[dict[str, Any]], agent: str, smi: str, smi_scale: float = 1.0
) -> float | None:
    """The median over the moments of |agent reading − nvidia-smi reading|."""
    gaps = []
    for m in moments:
        a, s = getattr(m["agent"], agent), m["smi"][smi]
        gaps.append(abs(a - s * smi_scale) if a is not None and s is not None else None)
    return _median(gaps)


def within(
    what: str, value: float | None, tolerance: float, unit: str, scale: float = 1.0
) -> Criterion:
    goal = f"≤ {tolerance / scale:.1f} {unit}"
    if value is None:
        return Criterion(what, "n/a (one side has no reading)", goal, None)
    return Criterion(what, f"median gap {value / scale:.1f} {unit}", goal, value <= tolerance)


def memory_used_criterion(moments: list[dict[str, Any]], reserved_mib: float | None) -> Criterion:
    """NVML's v1 "used" (what the agent shows) counts the driver's reserved memory, which
    newer nvidia-smi shows apart: either side may need it added."""
    total = moments[0]["agent"].memory_total_bytes or 0
    tolerance = max(256 * MIB, 0.01 * total)
    plain = within(
        "memory used, agent vs nvidia-smi",
        gap(moments, "memory_used_bytes", "memory.used", MIB),
        tolerance,
        "MiB",
        MIB,
    )
    if plain.ok is not False or reserved_mib is None:
        return plain
    shifted = [
        {**m, "smi": {"used": (m["smi"]["memory.used"] or 0) + reserved_mib}} for m in moments
    ]
    both = within(
        "memory used, agent vs nvidia-smi used + reserved",
        gap(shifted, "memory_used_bytes", "used", MIB),
        tolerance,
        "MiB",
        MIB,
    )
    return both if both.ok else plain


def allocator_criterion(moment: dict[str, Any]) -> Criterion:
    """allocated ≤ peak, allocated ≤ reserved ≤ the job's memory as NVML counts it."""
    a: DeviceReading = moment["agent"]
    process = moment["process_used"]
    what = "torch allocator: allocated ≤ reserved ≤ the job's NVML memory"
    goal = "in that order; NVML − reserved (the context) 0–2 GiB"
    if a.torch_allocated_bytes is None or a.torch_reserved_bytes is None:
        return Criterion(what, "the agent reported no allocator figures", goal, False)
    ordered = a.torch_allocated_bytes <= a.torch_reserved_bytes
    ordered = ordered and (a.torch_peak_bytes or 0) >= a.torch_allocated_bytes
    figures = f"{_gib(a.torch_allocated_bytes)} ≤ {_gib(a.torch_reserved_bytes)}"
    if process is None or process < 0:
        seen = "the job is not in its list (another PID namespace)" if process == -1 else "n/a"
        return Criterion(what, f"{figures}; NVML: {seen}", goal, None if ordered else False)
    context = process - a.torch_reserved_bytes
    measured = f"{figures} ≤ {_gib(process)} (context {context / MIB:.0f} MiB)"
    return Criterion(what, measured, goal, ordered and 0 <= context <= 2 * GIB)


def allocator_counters_criterion(moment: dict[str, Any]) -> Criterion:
    """The allocator's peak reserved, retries and OOMs (one ``torch.cuda.memory_stats``): read,
    and the peak at or above the reserved bytes now. The busy job is expected to show 0
    retries and 0 OOMs; the figures are reported, not judged."""
    a: DeviceReading = moment["agent"]
    what = "torch allocator: peak reserved ≥ reserved; retries and OOMs read"
    goal = "all three read; the peak at or above the reserved bytes"
    peak, reserved = a.torch_reserved_peak_bytes, a.torch_reserved_bytes
    if peak is None or reserved is None or a.alloc_retries is None or a.ooms is None:
        return Criterion(what, "the agent reported no allocator counters", goal, False)
    share = f" ({peak / a.memory_total_bytes:.0%} of the device)" if a.memory_total_bytes else ""
    measured = f"{_gib(peak)}{share} ≥ {_gib(reserved)}; {a.alloc_retries} retries, {a.ooms} OOMs"
    return Criterion(what, measured, goal, peak >= reserved)


def judge(moments: list[dict[str, Any]], reserved_mib: float | None, uuid: str) -> Finding:
    first, gpu = moments[0]["agent"], moments[-1]["gpu"]
    busy = _median([m["smi"]["utilization.gpu"] for m in moments])
    power = _median([m["smi"]["power.draw"] for m in moments]) or 0.0
    criteria = [
        Criterion(
            "the agent reads the GPU through NVML",
            "yes" if gpu.available and gpu.reason is None else f"no: {gpu.reason}",
            "available, no reason given",
            gpu.available and gpu.reason is None,
        ),
        Criterion(
            "the job keeps the GPU busy (nvidia-smi)", f"{busy}%", "≥ 50%", (busy or 0) >= 50
        ),
        within(
            "utilization, agent vs nvidia-smi",
            gap(moments, "util_percent", "utilization.gpu"),
            10.0,
            "points",
        ),
        memory_used_criterion(moments, reserved_mib),
        within(
            "memory total, agent vs nvidia-smi",
            gap(moments, "memory_total_bytes", "memory.total", MIB),
            0.01 * (first.memory_total_bytes or 0),
            "MiB",
            MIB,
        ),
        within(
            "temperature, agent vs nvidia-smi",
            gap(moments, "temperature_c", "temperature.gpu"),
            3.0,
            "°C",
        ),
        within(
            "power, agent vs nvidia-smi",
            gap(moments, "power_w", "power.draw"),
            max(25.0, 0.15 * power),
            "W",
        ),
        allocator_counters_criterion(moments[-1]),
        allocator_criterion(moments[-1]),
    ]
    failed = [c.what for c in criteria if c.ok is False]
    return Finding(
        summary=f"{len(moments)} moments; "
        + ("all readings agree" if not failed else f"off: {', '.join(failed)}"),
        criteria=criteria,
        tables=[readings_table(moments, f"Readings of {uuid} ({first.name})")],
        figures={
            "moments": len(moments),
            "gaps": {c.what: c.measured for c in criteria},
            "nvidia_smi_reserved_mib": reserved_mib,
        },
        notes=[
            "The agent samples devices every 0.2 s here (1 s by default) and sends the newest "
            "sample in each metrics message (10 a second); nvidia-smi runs as soon as a message "
            "is taken, so the two readings are at most ~0.3 s apart.",
        ],
    )


def readings_table(moments: list[dict[str, Any]], title: str) -> Table:
    def pair(a: float | None, s: float | None, scale: float = 1.0) -> str:
        known = [f"{v / scale:.1f}" if v is not None else "n/a" for v in (a, s)]
        return " / ".join(known)

    rows = []
    for i, m in enumerate(moments, 1):
        a, s = m["agent"], m["smi"]
        process = m["process_used"] if m["process_used"] and m["process_used"] > 0 else None
        rows.append(
            [
                str(i),
                pair(a.util_percent, s["utilization.gpu"]),
                pair(a.memory_used_bytes, (s["memory.used"] or 0) * MIB, GIB),
                pair(a.temperature_c, s["temperature.gpu"]),
                pair(a.power_w, s["power.draw"]),
                " · ".join(map(_gib, (a.torch_allocated_bytes, a.torch_reserved_bytes, process))),
                f"{m['lag_s'] * 1000:.0f} ms",
            ]
        )
    columns = [
        "moment",
        "util % (agent / smi)",
        "used GiB (agent / smi)",
        "°C (agent / smi)",
        "W (agent / smi)",
        "torch allocated · reserved · NVML process",
        "smi after the message",
    ]
    return Table(columns, rows, title=title)
