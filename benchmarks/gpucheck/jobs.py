"""The processes the GPU checks start (``python -m gpucheck.jobs COMMAND``), each a fresh
CUDA process that prints one JSON line:

- ``busy``: a training job with bsmon attached that keeps the GPU busy; prints its pid, socket
  and GPU, then trains until its time is up or its parent is gone.
- ``probe-job``: a training job that runs at two batch sizes (the memory model's points), then
  probes while it keeps training; prints the probe's result, its speed and its memory model.
- ``trial``: the job's own training step at one batch size, alone on the GPU: fits or not.
- ``ballast``: holds all but a given amount of the GPU's free memory until stdin closes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any

import torch

from .models import SPECS, train_step

TRIAL_STEPS = 3  # the first allocates the optimizer state; peaks settle by the second


def _print(message: dict[str, Any]) -> None:
    print(json.dumps(message), flush=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def busy(args: argparse.Namespace) -> int:
    from overhead_kit.models import make_step

    from bsmon.probes import attach

    model, optimizer, step, examples, _ = make_step("cnn", args.device, args.batch)
    parent, deadline = os.getppid(), time.monotonic() + args.seconds
    with attach(
        model, optimizer, batch_size=examples, name="gpu-check-busy", sample_interval_s=0.2
    ) as mon:
        for _ in range(5):
            step(mon)
        uuid = str(torch.cuda.get_device_properties(0).uuid) if args.device == "cuda" else "cpu"
        _print(
            {
                "pid": os.getpid(),
                "socket": str(mon.socket_path),
                "uuid": uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}",
            }
        )
        while time.monotonic() < deadline and os.getppid() == parent:
            for _ in range(20):
                step(mon)
    return 0


def _loader_forever(mon: Any, dataset: torch.utils.data.Dataset) -> Any:
    while True:
        yield from mon.dataloader(dataset, shuffle=True, drop_last=True)


def probe_job(args: argparse.Namespace) -> int:
    """The job the probe check probes. The noise scale is off, so the job's step is the
    trials' step exactly (the probe does not count the estimator's memory)."""
    import msgspec

    from bsmon.probes import attach
    from bsmon.probes.wire.protocol import ProbeResult

    spec = SPECS[args.model]
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = spec.build().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss_fn = spec.loss()
    batch = spec.job_batch
    dataset = torch.utils.data.TensorDataset(*spec.inputs(8 * batch, "cpu"))
    mon = attach(
        model,
        optimizer,
        batch_size=batch,
        loss_fn=loss_fn,
        name=f"gpu-check-{args.model}",
        noise_scale=None,
        sample_interval_s=0.25,
    )
    batches = _loader_forever(mon, dataset)

    def train(until: Any) -> tuple[int, float]:
        """Steps until ``until()`` is true; returns (steps, seconds), device work included."""
        _sync(device)
        steps, started = 0, time.perf_counter()
        while not until():
            x, y = next(batches)
            train_step(model, optimizer, loss_fn, x.to(device), y.to(device))
            steps += 1
        _sync(device)
        return steps, time.perf_counter() - started

    def for_seconds(seconds: float) -> Any:
        end = time.monotonic() + seconds
        return lambda: time.monotonic() >= end

    train(for_seconds(1.5))
    mon.request_batch_size(2 * batch, confirm=True)  # a second point for the memory model
    train(for_seconds(1.5))
    before = train(for_seconds(2.5))
    box: list[ProbeResult] = []
    prober = threading.Thread(target=lambda: box.append(mon.probe(timeout=args.timeout)))
    prober.start()
    during = train(lambda: not prober.is_alive())
    prober.join()
    mon.flush()
    control = mon.job.batch_control
    assert control is not None
    fit = control.memory.fit()
    result = {
        "probe": msgspec.to_builtins(box[0]),
        "steps_per_s_before": before[0] / before[1],
        "steps_per_s_during": during[0] / during[1] if during[1] > 0 else None,
        "probe_s": during[1],
        "job_batch": control.size,
        "memory_points": [[p.batch_size, p.peak_bytes] for p in control.memory.points()],
        "memory_budget": control.memory_budget,
        "memory_fit": [fit.intercept, fit.slope] if fit is not None else None,
        "memory_predicted_max": control.memory.predicted_max(control.memory_budget),
        "errors": mon.stats()["errors"],
    }
    mon.close()
    _print(result)
    return 0


def trial(args: argparse.Namespace) -> int:
    from bsmon.probes.batch.oom import is_out_of_memory

    spec = SPECS[args.model]
    torch.manual_seed(0)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    out: dict[str, Any] = {"batch": args.batch, "bf16": args.bf16, "checkpoint": args.checkpoint}
    try:
        model = spec.build().to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        loss_fn = spec.loss()
        x, y = spec.inputs(args.batch, device)
        how = {"bf16": args.bf16, "checkpoint": args.checkpoint}
        for _ in range(TRIAL_STEPS - 1):
            train_step(model, optimizer, loss_fn, x, y, **how)
        _sync(device)
        started = time.perf_counter()
        train_step(model, optimizer, loss_fn, x, y, **how)
        _sync(device)
        out.update(
            fits=True,
            step_time_s=time.perf_counter() - started,
            peak_allocated=torch.cuda.max_memory_allocated(device) if cuda else None,
            peak_reserved=torch.cuda.max_memory_reserved(device) if cuda else None,
        )
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        out.update(fits=False, error=str(exc).splitlines()[0][:200])
    _print(out)
    return 0


def ballast(args: argparse.Namespace) -> int:
    torch.cuda.init()
    free, total = torch.cuda.mem_get_info()
    size = free - int(args.leave_gib * 2**30)
    held = torch.empty(max(0, size), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    _print({"held_bytes": held.numel(), "free_before": free, "total": total})
    sys.stdin.read()  # until the check closes the pipe, or is gone
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpucheck.jobs")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("busy")
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--seconds", type=float, default=120.0)
    p = sub.add_parser("probe-job")
    p.add_argument("--model", choices=SPECS, required=True)
    p.add_argument("--timeout", type=float, default=120.0)
    p = sub.add_parser("trial")
    p.add_argument("--model", choices=SPECS, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--checkpoint", action="store_true")
    p = sub.add_parser("ballast")
    p.add_argument("--leave-gib", type=float, required=True)
    for name in ("busy", "probe-job", "trial"):  # the CPU: a dry run of the code, no figures
        sub.choices[name].add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    command = {"busy": busy, "probe-job": probe_job, "trial": trial, "ballast": ballast}
    return command[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
