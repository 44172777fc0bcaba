"""Part 2 of benchmarks/overhead.py, the noise scale: copies of the model, one monitor each
(noise scale off, at its defaults, on every step, and the floor), in interleaved blocks, each
timed with the other copies' forward watches suspended."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from pernorm_floor import FloorHooks

from .blocks import Block, Sample, Times, interleave, only, time_block
from .models import Step, make_step

NOISE_VARIANTS = {
    "agent": {"noise_scale": None},
    "noise": {},
    "noise-every-step": {"noise_budget": None},
}

FLOOR = "floor"

WARMUP_CAP = 600  # steps: the dense warm-up ends within 300 at the defaults


def warm_up(step: Step, mon: object) -> int:
    """Steps until the monitor's noise scale tracks under its budget (the end of the dense
    warm-up); returns how many it took (WARMUP_CAP: it did not end)."""
    noise = mon._noise  # type: ignore[attr-defined]
    for steps in range(1, WARMUP_CAP + 1):
        step(mon)
        if noise.source is None or noise.phase != "warming up":
            return steps
    return WARMUP_CAP


def warm_all(
    copies: dict[str, tuple[Step, object | None]],
    monitors: list[object],
    args: argparse.Namespace,
    defaults: str,
) -> int:
    """Untimed steps for every copy, each alone; the ``defaults`` copy first until its noise
    scale tracks. Returns how many steps that warm-up took."""
    warmed = 0
    for variant, (step, mon) in copies.items():
        with only(mon, monitors):
            if variant == defaults:
                warmed = warm_up(step, mon)
            for _ in range(args.warmup):
                step(mon)
    return warmed


def alone(
    step: Step,
    mon: object | None,
    monitors: list[object],
    steps: int,
    sync: Callable[[], None] | None = None,
) -> Sample:
    """A timed block of one copy, with every other copy's forward watch suspended."""
    with only(mon, monitors):
        return time_block(step, steps, mon, sync)


def bench_noise(
    name: str,
    args: argparse.Namespace,
    device: torch.device | str = "cpu",
    batch: int | None = None,
    sync: Callable[[], None] | None = None,
) -> tuple[Times, float]:
    """Three copies of the model, one monitor each (``NOISE_VARIANTS``), in interleaved
    blocks, the defaults timed once tracking; returns the times and the share of steps the
    default budget measured."""
    from bsmon.probes import attach

    copies = {}
    for variant, options in NOISE_VARIANTS.items():
        model, optimizer, step, examples, _ = make_step(name, device, batch)
        mon = attach(
            model, optimizer, batch_size=examples, name=f"bench-{variant}", serve=False, **options
        )
        copies[variant] = (step, mon)
    model, optimizer, step, examples, _ = make_step(name, device, batch)
    floor_mon = attach(
        model, optimizer, batch_size=examples, name="bench-floor", serve=False, noise_scale=None
    )
    floor = FloorHooks(model, optimizer)
    copies[FLOOR] = (step, floor_mon)
    monitors = [mon for _, mon in copies.values()]
    args.warmed_up = warm_all(copies, monitors, args, "noise")

    def block(step: Step, mon: object) -> Block:
        return lambda: alone(step, mon, monitors, args.block, sync)

    times = interleave({v: block(*copy) for v, copy in copies.items()}, args.rounds)
    share = copies["noise"][1]._noise.budget.share  # type: ignore[attr-defined]
    floor.close()
    for mon in monitors:
        mon.close()  # type: ignore[attr-defined]
    return times, share
