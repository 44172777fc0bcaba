"""Part 1 of benchmarks/overhead.py, the agent: blocks with no agent, the agent attached and
serving (a monitor process reading every message) and the same without the step anatomy."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from .blocks import Block, Sample, Times, interleave, time_block
from .models import Step, make_step

READER = """
import os, sys, time
from bsmon.probes.wire.client import JobConnection
path, received, parent = sys.argv[1], 0, os.getppid()
while os.getppid() == parent:  # a benchmark killed by a timeout must not leave this behind
    try:
        with JobConnection(path, timeout=1.0) as conn:
            while not conn.eof and os.getppid() == parent:
                received += len(conn.pump(0.5))
    except (ConnectionError, OSError):
        time.sleep(0.01)
"""

NO_ANATOMY = "agent, no anatomy"
AGENT_VARIANTS = {
    "off": None,
    NO_ANATOMY: {"noise_scale": None, "step_anatomy": False},
    "agent": {"noise_scale": None},
}


def agent_blocks(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    step: Step,
    batch: int,
    args: argparse.Namespace,
    sync: Callable[[], None] | None = None,
) -> dict[str, Block]:
    """One block per variant of ``AGENT_VARIANTS``: ``off`` times the bare steps; the others
    attach afresh, warm up, time ``args.agent_steps`` steps and close."""
    from bsmon.probes import attach

    def block(options: dict | None) -> Block:
        def run() -> Sample:
            if options is None:
                return time_block(step, args.agent_steps, None, sync)
            mon = attach(model, optimizer, batch_size=batch, name="bench-agent", **options)
            try:
                for _ in range(args.warmup):
                    step(mon)
                return time_block(step, args.agent_steps, mon, sync)
            finally:
                mon.close()

        return run

    return {variant: block(options) for variant, options in AGENT_VARIANTS.items()}


def bench_agent(
    name: str,
    args: argparse.Namespace,
    device: torch.device | str = "cpu",
    batch: int | None = None,
    sync: Callable[[], None] | None = None,
) -> Times:
    model, optimizer, step, examples, _ = make_step(name, device, batch)
    for _ in range(args.warmup):
        step(None)
    blocks = agent_blocks(model, optimizer, step, examples, args, sync)
    return interleave(blocks, args.agent_rounds)


def start_reader(socket_path: Path) -> subprocess.Popen:
    """A monitor process that connects to ``socket_path`` (again and again, as benchmark
    blocks attach and close) and reads every message; it exits when its parent does."""
    return subprocess.Popen(
        [sys.executable, "-c", READER, str(socket_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
