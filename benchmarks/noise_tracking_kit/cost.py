"""The noise scale's cost at the defaults, side by side: two copies of a job in one process,
one attached with ``noise_scale=None`` and one at the defaults, in interleaved blocks of
steps (benchmarks/overhead.py's method and its ``overhead_kit.blocks``), each block timed
with the other copy's forward watch suspended. Timed once the defaults copy's noise scale has
left its warm-up (its ``phase``), or after ``WARMUP_CAP`` steps if it says none."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from overhead_kit.blocks import Times, interleave, only, time_block
from torch import nn

from .tasks import TRACKING_TASKS

COST_MODELS = ("T1 MLP", "demo CNN", "transformer")
COST_BATCH = 64
WARMUP_MIN, WARMUP_CAP = 200, 1000  # steps
BLOCK_SECONDS = 0.5
VARIANTS = {"noise off": {"noise_scale": None}, "defaults": {}}


def _demo_cnn() -> tuple[nn.Module, torch.optim.Optimizer, Any, Any]:
    from bsmon.probes.demo import DemoCNN, make_dataset

    data = make_dataset(4096)
    model = DemoCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    batches = _cycle(torch.utils.data.DataLoader(data, batch_size=COST_BATCH, drop_last=True))
    return model, optimizer, batches, nn.functional.cross_entropy


def _tracking(name: str) -> Callable[[], tuple[nn.Module, torch.optim.Optimizer, Any, Any]]:
    def build() -> tuple[nn.Module, torch.optim.Optimizer, Any, Any]:
        job = TRACKING_TASKS[name].job(0, COST_BATCH)
        return job.model, job.optimizer, job.batches, job.loss

    return build


def _cycle(loader: torch.utils.data.DataLoader) -> Any:
    while True:
        yield from loader


BUILDERS = {
    "T1 MLP": _tracking("T1"),
    "demo CNN": _demo_cnn,
    "transformer": _tracking("transformer"),
}


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, batches: Any, loss_fn: Any) -> Any:
    def step(mon: Any) -> None:
        x, y = next(batches)
        loss = loss_fn(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        mon.log(loss=loss)

    return step


def _warm_up(step: Any, mon: Any) -> int:
    """Steps until the defaults copy's noise scale is past its warm-up."""
    for steps in range(1, WARMUP_CAP + 1):
        step(mon)
        if steps >= WARMUP_MIN and steps % 20 == 0:
            mon.flush()
            if mon.stats()["noise"].get("phase") != "warming up":
                return steps
    return WARMUP_CAP


def noise_cost(name: str, rounds: int) -> tuple[Times, int, int, dict[str, Any]]:
    """The two copies' block times; the warm-up's steps, the block's steps and the defaults
    copy's last reading."""
    from bsmon.probes import attach

    copies = {}
    for variant, options in VARIANTS.items():
        torch.manual_seed(0)
        model, optimizer, batches, loss_fn = BUILDERS[name]()
        mon = attach(model, optimizer, batch_size=COST_BATCH, serve=False, record=False, **options)
        copies[variant] = (_step(model, optimizer, batches, loss_fn), mon)
    monitors = [mon for _, mon in copies.values()]
    try:
        step, mon = copies["defaults"]
        with only(mon, monitors):
            warmed = _warm_up(step, mon)
            began = time.perf_counter()
            for _ in range(10):
                step(mon)
            block = max(10, round(BLOCK_SECONDS / ((time.perf_counter() - began) / 10)))
        step, mon = copies["noise off"]
        with only(mon, monitors):
            for _ in range(warmed):
                step(mon)

        def timed(variant: str) -> Any:
            step, mon = copies[variant]

            def run() -> Any:
                with only(mon, monitors):
                    return time_block(step, block, mon)

            return run

        times = interleave({variant: timed(variant) for variant in copies}, rounds)
        defaults = copies["defaults"][1]
        defaults.flush()
        return times, warmed, block, dict(defaults.stats()["noise"])
    finally:
        for mon in monitors:
            mon.close()
