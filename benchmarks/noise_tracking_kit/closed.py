"""The stationary closed forms of issue 40: linear regressions whose B_simple is known
exactly (workloads/noise_jobs.py), at learning rate 0, a fresh batch of 64 a step, 3,000 steps,
``attach(..., noise_window=500)``, the estimate at the end against the truth."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import torch

from workloads.noise_jobs import Case, Regression, train

CLOSED_CASES = {
    "A: 6 inputs, no bias": Case(
        "A", c=(2, 1, 0.5, 0.5, 1, 3), delta=(0.05, -0.1, 0.2, 0, 0.1, 0.05), sigma2=0.5
    ),
    "B: 10 inputs, bias": Case("B", c=(1.0,) * 10, delta=(0.1,) * 10, sigma2=1.0, beta=0.2),
}
CLOSED_STEPS, CLOSED_BATCH, CLOSED_WINDOW = 3000, 64, 500


def closed_run(case: Case, seed: int) -> dict[str, Any]:
    """One run; bsmon's ``stats()["noise"]`` at the end."""
    from bsmon.probes import attach

    torch.manual_seed(seed)
    job = Regression(case, seed)
    optimizer = torch.optim.SGD(job.model.parameters(), lr=0.0)
    options = {"serve": False, "record": False, "noise_window": CLOSED_WINDOW}
    with attach(job.model, optimizer, batch_size=CLOSED_BATCH, **options) as mon:
        train(job, optimizer, steps=CLOSED_STEPS, batch=CLOSED_BATCH)
        mon.flush()
        return dict(mon.stats()["noise"])


@contextlib.contextmanager
def busy_loops(count: int) -> Iterator[None]:
    """``count`` processes spinning a CPU each while inside (the goal's "two busy loops")."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
