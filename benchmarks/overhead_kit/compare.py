"""Part 3 of benchmarks/overhead.py (``--compare``), what a user would pick instead: the loop
logging its loss to W&B (offline), to TensorBoard, and to bsmon without and with the noise
scale, against the bare loop."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from .blocks import Block, Times, interleave
from .models import Step, make_step
from .noise import alone, warm_all


def logger_step(step: Step, log: Callable[[float, int], None]) -> Step:
    """``step`` with its loss logged as a Python float, the way W&B and TensorBoard take it."""
    counter = iter(range(1 << 62))

    def logged(_mon: object | None) -> None:
        loss = step(None)
        log(loss.item(), next(counter))  # type: ignore[union-attr]

    return logged


def bench_compare(name: str, args: argparse.Namespace, directory: Path) -> tuple[Times, int]:
    """Part 3: the loop bare, logging to W&B (offline), to TensorBoard, to bsmon without and
    with the noise scale; one copy of the model each, interleaved blocks."""
    import wandb
    from torch.utils.tensorboard import SummaryWriter

    from bsmon.probes import attach

    os.environ["WANDB_MODE"] = "offline"
    run = wandb.init(project="bsmon-bench", dir=str(directory), settings=wandb.Settings(quiet=True))
    writer = SummaryWriter(str(directory / "tensorboard"))
    steps: dict[str, tuple[Step, object | None]] = {"bare": (make_step(name)[2], None)}
    steps["W&B offline"] = (
        logger_step(make_step(name)[2], lambda v, i: run.log({"loss": v}, step=i)),
        None,
    )
    steps["TensorBoard"] = (
        logger_step(make_step(name)[2], lambda v, i: writer.add_scalar("loss", v, i)),
        None,
    )
    monitors = []
    for variant, options in (("bsmon telemetry", {"noise_scale": None}), ("bsmon defaults", {})):
        model, optimizer, step, examples, _ = make_step(name)
        mon = attach(model, optimizer, batch_size=examples, name=variant, **options)
        steps[variant] = (step, mon)
        monitors.append(mon)
    warmed = warm_all(steps, monitors, args, "bsmon defaults")

    def block(step: Step, mon: object | None) -> Block:
        return lambda: alone(step, mon, monitors, args.block)

    try:
        return interleave({v: block(*pair) for v, pair in steps.items()}, args.rounds), warmed
    finally:
        for mon in monitors:
            mon.close()
        writer.close()
        run.finish()
