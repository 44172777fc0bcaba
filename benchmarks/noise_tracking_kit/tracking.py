"""One run of a moving target: train at a fixed batch with bsmon at its defaults and, at
checkpoints, read the live B_simple with its 95% interval and take the exact one at the
same weights.

The exact value is computed between two steps on a twin of the model (made before
``attach``, loaded with the model's weights at the checkpoint), so that no example's forward
pass meets bsmon's hooks; no random number is drawn and no ``.grad`` written, so training
runs as it would without it. Its seconds between two steps would read as one long step:
the model is switched to ``eval()`` and back around it, which bsmon takes as an evaluation
in the loop (as a job's validation pass) and keeps out of its step times — and so out of
the noise scale's time budget and the steps it paces.
"""

from __future__ import annotations

import contextlib
import copy
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from torch import nn

from .exact import Exact, exact_noise
from .tasks import TrackingTask

FIRST_DECISION = 64  # the autopilot's first look (bsmon.probes.batch.autopilot.WARMUP_STEPS)


def checkpoints(steps: int) -> list[int]:
    """32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, … (×1 and ×1.5 of the powers of two
    from 64, log-spaced) up to ``steps``, which is always the last."""
    points = [32]
    power = 64
    while power <= steps:
        points += [power, power * 3 // 2]
        power *= 2
    return sorted({p for p in points if p < steps} | {steps})


@dataclass(frozen=True)
class Point:
    """A checkpoint: the exact value and what bsmon read live (``noise``: its
    ``stats()["noise"]``)."""

    seed: int
    step: int
    exact: Exact
    noise: dict[str, Any]

    @property
    def live(self) -> float | None:
        return self.noise.get("b_simple")

    @property
    def ratio(self) -> float | None:
        live = self.live
        return None if live is None else live / self.exact.b_simple

    @property
    def interval(self) -> tuple[float, float] | None:
        """The 95% interval (an open end: unbounded); None when there is none."""
        low, high = self.noise.get("ci_low"), self.noise.get("ci_high")
        if low is None and high is None:
            return None
        return (low or 0.0, high if high is not None else float("inf"))

    @property
    def covered(self) -> bool:
        interval = self.interval
        return interval is not None and interval[0] <= self.exact.b_simple <= interval[1]


@contextlib.contextmanager
def off_the_clock(model: nn.Module) -> Iterator[None]:
    """bsmon counts the time inside as an evaluation, not as step time; the mode is kept."""
    training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(training)


def track(task: TrackingTask, seed: int, batch: int, steps: int, examples: int) -> list[Point]:
    """Train ``steps`` steps of ``batch`` examples from ``seed``; a ``Point`` per checkpoint."""
    from bsmon.probes import attach

    inputs, labels = task.fixed_set(examples)
    job = task.job(seed, batch)
    model = job.model
    twin = copy.deepcopy(model)
    wanted = set(checkpoints(steps))
    points = []
    mon = attach(model, job.optimizer, batch_size=batch, serve=False, record=False)
    try:
        for step in range(1, steps + 1):
            x, y = next(job.batches)
            loss = job.loss(model(x), y)
            job.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            job.optimizer.step()
            mon.log(loss=loss)
            if step in wanted:
                mon.flush()
                noise = dict(mon.stats()["noise"])
                with off_the_clock(model):
                    twin.load_state_dict(model.state_dict())
                    exact = exact_noise(twin, job.loss, inputs, labels)
                points.append(Point(seed, step, exact, noise))
                print(
                    f"  [{task.name} seed {seed}] step {step}: {_said(points[-1])}",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        mon.close()
    return points


def _said(point: Point) -> str:
    live = point.live
    shown = "none" if live is None else f"{live:,.0f}"
    return f"exact {point.exact.b_simple:,.0f}, live {shown}"
