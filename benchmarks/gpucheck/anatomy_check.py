"""The step anatomy against synchronized phases, and the profiler's kernels by phase.

The CNN of benchmarks/overhead.py trains with the agent attached (noise scale off, every step
timed). In interleaved rounds, a block of ``STEPS`` ordinary steps — exactly the anatomy's
window, read after the block — alternates with a block of as many synchronized steps: the same
step with ``torch.cuda.synchronize()`` at each phase boundary (forward and loss | backward |
optimizer step), timed with ``perf_counter``, so that each phase's time includes the device
work it launched, backward's kernels too (autograd launches them from its own thread, which
the profiler's ``record_function`` ranges on the training thread do not see: on the H100 they
gave backward 0 ms). Synchronizing makes those steps slower, so what is compared is each
phase's share of the step, summed over the rounds, not absolute times. Each block begins with
one step outside the window, which holds the pause to read the anatomy before it.

For information: the anatomy of the synchronized steps themselves (the same steps as the
reference: the anatomy's phase boundaries, without the question of host against device time),
and the profiler's kernels. The profiler records a last block with a ``record_function``
marker per phase on the training thread and gives each CUDA kernel's device time to the phase
whose marker was open when the op that launched it started (backward's ops, on autograd's
thread, start while the training thread's backward marker waits for them).

Runs on a CPU as well (tests/processes/test_gpu_check.py runs it there): synchronize is then a
no-op, each phase's time is its wall time, and no kernel is seen.
"""

from __future__ import annotations

import bisect
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from .procs import Deadline
from .report import Criterion, Finding, Table, missed

STEPS = 100  # the anatomy's window (anatomy.window.RECENT_STEPS), and each block's steps
WARMUP = 20
ROUNDS = 4  # each: a block of ordinary steps, then a block of synchronized steps
PROFILED_STEPS = 50
GOAL_POINTS = 5.0  # |synchronized share − anatomy share| per phase, in percentage points
PHASES = ("forward", "backward", "optimizer")
SECONDS = ("step", *PHASES)
TOTALS = ("steps", *SECONDS)  # a step count, then seconds summed over those steps
MARKER = "check."
GPU_BATCH = 256

Phases = Callable[[], tuple[Callable[[], Any], ...]]


def measure(
    device: str, batch: int, rounds: int = ROUNDS, profiled_steps: int = PROFILED_STEPS
) -> dict[str, Any]:
    """Over the rounds, each phase's seconds: by the anatomy of the ordinary steps, by the
    synchronized steps' clock and by the anatomy of those; and per step, the kernels' device
    seconds by phase (the profiler)."""
    import torch
    from overhead_kit.models import MODELS

    from bsmon.probes import attach
    from bsmon.probes.anatomy.sampling import STRIDE_VARIABLE

    torch.manual_seed(0)
    model, inputs, loss_fn, _ = MODELS["cnn"][0](batch)
    model = model.to(device)
    inputs = tuple(t.to(device) for t in inputs)
    target = torch.randint(0, 10, (batch,), device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else _nothing_to_wait_for

    def phases() -> tuple[Callable[[], Any], ...]:
        """The step, in its three phases (the loss's tensor passed from the first on)."""
        box: list[Any] = []
        return (
            lambda: box.append(loss_fn(model(*inputs), target)),
            lambda: box.pop().backward(),
            optimizer.step,
        )

    def step() -> None:
        for phase in phases():
            phase()
        optimizer.zero_grad(set_to_none=True)

    os.environ[STRIDE_VARIABLE] = "1"  # every step timed: the window is the block's steps
    try:
        mon = attach(model, optimizer, serve=False, record=False, noise_scale=None)
    finally:
        del os.environ[STRIDE_VARIABLE]
    totals = {key: dict.fromkeys(TOTALS, 0.0) for key in ("anatomy", "synchronized", "self")}
    readings: list[dict[str, Any]] = []

    def read_window(into: str) -> None:
        assert mon.flush(timeout=30)
        readings.append(mon.stats()["anatomy"])
        _add(totals[into], window_totals(readings[-1]))

    with mon:
        for _ in range(WARMUP):
            step()
        for _ in range(rounds):
            for _ in range(1 + STEPS):
                step()
            read_window("anatomy")
            step()
            _add(totals["synchronized"], synchronized_steps(phases, optimizer, sync, STEPS))
            read_window("self")
        kernels = profiled_kernels(phases, optimizer, cuda, profiled_steps)
    return {
        **totals,
        "kernels": kernels,
        "window_steps": [reading["steps"] for reading in readings],
        "verdict": readings[0].get("verdict"),
        "clock": readings[0].get("clock"),
    }


def window_totals(anatomy: dict[str, Any]) -> dict[str, float]:
    """The anatomy's reading (seconds per step over its window) as totals."""
    n = anatomy["steps"]
    return {"steps": n, **{key: (anatomy.get(f"{key}_s") or 0.0) * n for key in SECONDS}}


def _nothing_to_wait_for() -> None:
    """No device queue to wait for: on a CPU the phases are done when their calls return."""


def _add(totals: dict[str, float], more: dict[str, float]) -> None:
    for key, seconds in more.items():
        totals[key] += seconds


def synchronized_steps(
    phases: Phases, optimizer: Any, sync: Callable[[], None], steps: int
) -> dict[str, float]:
    """Seconds in each phase over ``steps`` steps, each phase ended by a synchronize. A step
    runs from the previous one's optimizer step to its own, as the anatomy's does (so the
    ``zero_grad`` between them falls in the forward)."""
    totals = dict.fromkeys(TOTALS, 0.0)
    totals["steps"] = steps
    sync()
    last = time.perf_counter()
    for _ in range(steps):
        start = last
        for name, phase in zip(PHASES, phases(), strict=True):
            phase()
            sync()
            now = time.perf_counter()
            totals[name] += now - last
            last = now
        totals["step"] += last - start
        optimizer.zero_grad(set_to_none=True)
    return totals


def profiled_kernels(phases: Phases, optimizer: Any, cuda: bool, steps: int) -> dict[str, float]:
    """Per step, the device seconds of the kernels launched in each phase (all 0 on a CPU)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            for name, phase in zip(PHASES, phases(), strict=True):
                with record_function(MARKER + name):
                    phase()
            optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
    return kernels_by_phase(prof.events(), steps)


def kernels_by_phase(events: Iterable[Any], steps: int) -> dict[str, float]:
    """Per step, each phase's kernel seconds: the kernels the profiler linked to each
    CPU-side op (its own, not its children's), given to the phase whose marker on the
    training thread was open when the op started, whichever thread it ran on."""
    events = [e for e in events if str(e.device_type).endswith("CPU") and not e.is_async]
    windows = sorted(
        (e.time_range.start, e.time_range.end, e.name.removeprefix(MARKER))
        for e in events
        if e.name.startswith(MARKER) and e.name.removeprefix(MARKER) in PHASES
    )
    starts = [start for start, _, _ in windows]
    totals = dict.fromkeys(PHASES, 0.0)
    for event in events:
        device_us = sum(kernel.duration for kernel in event.kernels)
        at = bisect.bisect_right(starts, event.time_range.start) - 1
        if device_us and at >= 0 and event.time_range.start <= windows[at][1]:
            totals[windows[at][2]] += device_us / 1e6
    return {phase: seconds / steps for phase, seconds in totals.items()}


def shares(seconds: dict[str, float]) -> dict[str, float]:
    """Each phase's share of the step, in percent."""
    step = seconds["step"]
    return {phase: 100 * seconds[phase] / step if step else 0.0 for phase in PHASES}


def compare(measured: dict[str, Any]) -> tuple[list[Criterion], list[list[str]]]:
    """Each phase's share of the step by the anatomy and by the synchronized steps (judged),
    and by the anatomy of the synchronized steps themselves (information)."""
    anatomy, synchronized, itself = (measured[k] for k in ("anatomy", "synchronized", "self"))
    ours, theirs, same = shares(anatomy), shares(synchronized), shares(itself)
    kernels = measured["kernels"]
    kernel_total = sum(kernels.values())
    criteria, rows = [], []
    for phase in PHASES:
        gap = abs(ours[phase] - theirs[phase])
        criteria.append(
            Criterion(
                f"{phase}: anatomy vs synchronized share of the step",
                f"{ours[phase]:.1f}% vs {theirs[phase]:.1f}% ({gap:.1f} points)",
                f"≤ {GOAL_POINTS:.0f} points",
                gap <= GOAL_POINTS,
            )
        )
        kernel_share = f"{100 * kernels[phase] / kernel_total:.1f}%" if kernel_total else "—"
        rows.append(
            [phase, _ms(anatomy, phase), f"{ours[phase]:.1f}%", _ms(synchronized, phase),
             f"{theirs[phase]:.1f}%", f"{same[phase]:.1f}%", f"{1e3 * kernels[phase]:.2f} ms",
             kernel_share]
        )  # fmt: skip
    gaps = ", ".join(f"{p} {abs(same[p] - theirs[p]):.1f}" for p in PHASES)
    criteria.append(
        Criterion(
            "the anatomy of the synchronized steps vs their own phases (points)",
            gaps,
            "information: the phase boundaries alone, the same steps",
            None,
        )
    )
    return criteria, rows


def _ms(totals: dict[str, float], key: str) -> str:
    """Milliseconds per step."""
    return f"{1e3 * totals[key] / (totals['steps'] or 1):.2f} ms"


def run(deadline: Deadline) -> Finding:
    deadline.require(20, "the anatomy against synchronized phases")
    measured = measure("cuda", GPU_BATCH)
    criteria, rows = compare(measured)
    columns = ["phase", "anatomy", "share", "synchronized", "share"]
    columns += ["anatomy of the synchronized", "kernels (profiler)", "share"]
    table = Table(
        columns,
        rows,
        title=f"CNN, batch {GPU_BATCH}, {ROUNDS} rounds of {STEPS} ordinary and {STEPS} "
        f"synchronized steps (the anatomy's windows: "
        f"{', '.join(map(str, measured['window_steps']))} steps), {measured['clock']}; step "
        f"{_ms(measured['anatomy'], 'step')} (synchronized "
        f"{_ms(measured['synchronized'], 'step')}), verdict {measured['verdict']}",
    )
    off = missed(criteria)
    return Finding(
        summary="every phase within 5 points of the synchronized steps"
        if not off
        else f"off by more than 5 points: {', '.join(off)}",
        criteria=criteria,
        tables=[table],
        figures={
            k: measured[k] for k in ("anatomy", "synchronized", "self", "kernels", "window_steps")
        },
        notes=[
            "Synchronized steps are slower than ordinary ones (the host waits at each phase "
            "boundary): their times per step are shown, their shares are compared.",
            f"Kernels: the profiler's device time per step of the kernels launched in each "
            f"phase ({PROFILED_STEPS} steps, markers on the training thread), for "
            "information; their share is of the kernels' total, not of the step.",
        ],
    )
