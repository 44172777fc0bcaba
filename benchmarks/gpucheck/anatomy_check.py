"""The step anatomy against torch.profiler on the same steps.

The CNN of benchmarks/overhead.py trains with the agent attached (noise scale off). Over the
last ``STEPS`` steps — exactly the steps in the anatomy's window — the profiler records each
step's forward (and loss), backward and optimizer step as ``record_function`` ranges: on a GPU
their device-side spans (the kernels between the range's ends), on a CPU their wall time.
Each phase's share of the step by the profiler is compared with the anatomy's share. The
profiler's own cost falls on both alike: they time the same steps.

Runs on a CPU as well (tests/processes/test_gpu_check.py runs it there).
"""

from __future__ import annotations

import os
from typing import Any

from .procs import Deadline
from .report import Criterion, Finding, Table, missed

STEPS = 100  # the anatomy's window (anatomy.window.RECENT_STEPS)
WARMUP = 20
GOAL_POINTS = 5.0  # |profiler share − anatomy share| per phase, in percentage points
PHASES = ("forward", "backward", "optimizer")
GPU_BATCH = 256


def measure(device: str, batch: int, steps: int = STEPS) -> dict[str, Any]:
    """The anatomy and the profiler's per-step seconds of each phase over the same steps."""
    import torch
    from overhead import MODELS
    from torch.profiler import ProfilerActivity, profile, record_function

    from bsmon.probes import attach
    from bsmon.probes.anatomy.sampling import STRIDE_VARIABLE

    torch.manual_seed(0)
    model, inputs, loss_fn, _ = MODELS["cnn"][0](batch)
    model = model.to(device)
    inputs = tuple(t.to(device) for t in inputs)
    target = torch.randint(0, 10, (batch,), device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step(ranges: bool) -> None:
        labels = iter(f"check.{phase}" for phase in PHASES)
        with record_function(next(labels)) if ranges else _nothing():
            loss = loss_fn(model(*inputs), target)
        with record_function(next(labels)) if ranges else _nothing():
            loss.backward()
        with record_function(next(labels)) if ranges else _nothing():
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    os.environ[STRIDE_VARIABLE] = "1"  # every step timed: the same steps as the profiler's
    try:
        mon = attach(model, optimizer, serve=False, record=False, noise_scale=None)
    finally:
        del os.environ[STRIDE_VARIABLE]
    with mon:
        for _ in range(WARMUP):
            step(ranges=False)
        with profile(activities=activities) as prof:
            for _ in range(steps):
                step(ranges=True)
            if cuda:
                torch.cuda.synchronize()
        assert mon.flush(timeout=30)
        anatomy = mon.stats()["anatomy"]
    return {"anatomy": anatomy, "profiler": _phase_seconds(prof, steps, cuda)}


def _nothing() -> Any:
    import contextlib

    return contextlib.nullcontext()


def _phase_seconds(prof: Any, steps: int, cuda: bool) -> dict[str, float]:
    """Per step, each phase's seconds: device-side spans of the ranges on a GPU, else wall."""
    totals = dict.fromkeys(PHASES, 0.0)
    for event in prof.events():
        name = event.name
        if not name.startswith("check."):
            continue
        on_device = str(getattr(event, "device_type", "")).endswith("CUDA")
        if on_device != cuda:
            continue
        totals[name.removeprefix("check.")] += event.time_range.elapsed_us() / 1e6
    return {phase: seconds / steps for phase, seconds in totals.items()}


def compare(measured: dict[str, Any]) -> tuple[list[Criterion], list[list[str]]]:
    """Each phase's share of the step by the anatomy and by the profiler."""
    anatomy, profiler = measured["anatomy"], measured["profiler"]
    step_s = anatomy["step_s"]
    criteria, rows = [], []
    for phase in PHASES:
        ours = 100 * (anatomy.get(f"{phase}_s") or 0.0) / step_s
        theirs = 100 * profiler[phase] / step_s
        gap = abs(ours - theirs)
        criteria.append(
            Criterion(
                f"{phase}: anatomy vs profiler share of the step",
                f"{ours:.1f}% vs {theirs:.1f}% ({gap:.1f} points)",
                f"≤ {GOAL_POINTS:.0f} points",
                gap <= GOAL_POINTS,
            )
        )
        rows.append(
            [phase, f"{1e3 * (anatomy.get(f'{phase}_s') or 0):.2f} ms", f"{ours:.1f}%",
             f"{1e3 * profiler[phase]:.2f} ms", f"{theirs:.1f}%"]
        )  # fmt: skip
    return criteria, rows


def run(deadline: Deadline) -> Finding:
    deadline.require(20, "the anatomy against the profiler")
    measured = measure("cuda", GPU_BATCH)
    criteria, rows = compare(measured)
    anatomy = measured["anatomy"]
    table = Table(
        ["phase", "anatomy", "share", "profiler", "share"],
        rows,
        title=f"CNN, batch {GPU_BATCH}, {anatomy['steps']} steps, {anatomy['clock']}; "
        f"step {1e3 * anatomy['step_s']:.2f} ms, verdict {anatomy.get('verdict')}",
    )
    off = missed(criteria)
    return Finding(
        summary="every phase within 5 points of the profiler"
        if not off
        else f"off by more than 5 points: {', '.join(off)}",
        criteria=criteria,
        tables=[table],
        figures={"anatomy": anatomy, "profiler": measured["profiler"]},
    )
