"""What the measured steps can hold: bsmon's own estimator fed every step, or one in k.

The live value at the defaults is limited by two things at once — how bsmon averages the
steps it measures, and how few steps its cost budget lets it measure. This part takes them
apart. A run records, on every step, the batch's own per-example sums (every example's
gradient, ``torch.func``, before the update: the numbers bsmon's per-example hooks give on a
measured step) and the exact value at the checkpoints. The recording is then replayed through
bsmon's agent-side ``Tracker`` (the averages, the drift restart, the read forward for growth:
everything after a step's record) as if one step in ``k`` had been measured, for several k.
A share that meets the goals here is what the budget would have to buy; one that misses them
with every step measured is beyond any budget.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .exact import Exact, exact_noise
from .goals import Tracking, tracking
from .tasks import TrackingTask
from .tracking import Point, checkpoints

SHARES = (1, 3, 10, 30, 100)  # one step in k measured


@dataclass(frozen=True)
class StepSums:
    """One step's batch of n examples: |ḡ|² (the step's gradient) and Σ|c_i|² over the
    examples' contributions c_i = g_i / n to it (what bsmon's per-example hooks sum)."""

    total: float
    squares: float
    examples: int


@dataclass(frozen=True)
class Recording:
    seed: int
    steps: list[StepSums]  # steps[i] is training step i + 1
    exact: dict[int, Exact]  # after the step of that number


def step_sums(found: Exact) -> StepSums:
    """The sums bsmon's hooks would give, from the batch's unbiased tr Σ and |G|²:
    |ḡ|² = |G|² + tr Σ / n and Σ|g_i|² = (n − 1)·tr Σ + n·|ḡ|²."""
    n = found.n
    total = found.g2 + found.trace / n
    return StepSums(total, ((n - 1) * found.trace + n * total) / (n * n), n)


def record(task: TrackingTask, seed: int, batch: int, steps: int, examples: int) -> Recording:
    """Train ``steps`` steps without bsmon, keeping every step's sums and the exact value at
    each checkpoint."""
    inputs, labels = task.fixed_set(examples)
    job = task.job(seed, batch)
    model, twin = job.model, copy.deepcopy(job.model)
    wanted = set(checkpoints(steps))
    sums, exact = [], {}
    for step in range(1, steps + 1):
        x, y = next(job.batches)
        twin.load_state_dict(model.state_dict())
        sums.append(step_sums(exact_noise(twin, job.loss, x, y, chunk=len(x))))
        loss = job.loss(model(x), y)
        job.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        job.optimizer.step()
        if step in wanted:
            twin.load_state_dict(model.state_dict())
            exact[step] = exact_noise(twin, job.loss, inputs, labels)
            print(
                f"  [{task.name} seed {seed}] step {step}: exact {exact[step].b_simple:,.0f}",
                file=sys.stderr,
                flush=True,
            )
    return Recording(seed, sums, exact)


def replay(recording: Recording, every: int, window: int = 1000) -> list[Point]:
    """bsmon's ``Tracker`` fed steps 1, 1 + k, 1 + 2k, …; a ``Point`` per checkpoint with the
    reading it would have shown then."""
    from bsmon.probes.noise.step_record import StepRecord
    from bsmon.probes.noise.tracker import Tracker

    tracker = Tracker(window)
    points, last = [], 0
    for step, sums in enumerate(recording.steps, start=1):
        if (step - 1) % every == 0:
            values = [sums.total, 1.0, sums.squares]
            n = sums.examples
            tracker.add(
                StepRecord(
                    step,
                    "per_example",
                    torch.tensor(values),
                    n,
                    ((n, 1.0, 1.0),),
                    gap=step - last if last else 1,
                ),
                values,
            )
            last = step
        if step in recording.exact:
            reading = tracker.reading("per_example", 1.0, False, False, None, now=step)
            noise = {
                "b_simple": reading.b_simple,
                "ci_low": reading.ci_low,
                "ci_high": reading.ci_high,
                "samples": reading.samples,  # the measured steps the averages took in
            }
            points.append(Point(recording.seed, step, recording.exact[step], noise))
    return points


def ceiling(recordings: Sequence[Recording], every: int) -> Tracking:
    """The goals' reading of the replays at one step in ``every``."""
    return tracking([replay(r, every) for r in recordings])
