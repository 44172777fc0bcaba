"""benchmarks/noise_tracking.py's ceiling part: every step's per-example sums recorded without
bsmon, replayed through bsmon's own ``Tracker`` as if one step in k were measured."""

from __future__ import annotations

import importlib
import random

import pytest
import torch
from torch import nn

from bsmon.probes.noise.estimators import per_example

from ..gpu_check_kit import BENCHMARKS  # noqa: F401  (puts benchmarks/ on the import path)

ceiling = importlib.import_module("noise_tracking_kit.ceiling")
exact = importlib.import_module("noise_tracking_kit.exact")
tasks = importlib.import_module("noise_tracking_kit.tasks")
pairs = importlib.import_module("autopilot_kit.tasks").Pairs


def test_a_steps_sums_give_bsmon_the_batchs_own_trace_and_mean() -> None:
    """The sums are in the units bsmon's hooks sum (each example's contribution to the mean
    gradient): its estimator reads back exactly the batch's unbiased tr Σ and |G|²."""
    found = exact.Exact(trace=37.5, g2=0.42, n=64, stderr=None)
    sums = ceiling.step_sums(found)
    back = per_example(sums.squares, sums.total, sums.examples)
    assert back.trace == pytest.approx(37.5, rel=1e-12)
    assert back.g2 == pytest.approx(0.42, rel=1e-12)


def stationary(steps: int, truth_trace: float = 50.0, g2: float = 1.0) -> object:
    """A recording whose every step is an unbiased draw around tr Σ = 50, |G|² = 1."""
    draw = random.Random(0)
    sums = [
        ceiling.step_sums(
            exact.Exact(truth_trace * draw.uniform(0.9, 1.1), g2 + draw.gauss(0, 0.3), 64, None)
        )
        for _ in range(steps)
    ]
    truth = exact.Exact(truth_trace, g2, 10**6, None)
    return ceiling.Recording(0, sums, {100: truth, steps: truth})


def test_the_replay_feeds_one_step_in_k_and_reads_what_bsmon_would() -> None:
    recording = stationary(600)
    every_step = ceiling.replay(recording, 1)
    one_in_ten = ceiling.replay(recording, 10)
    assert [p.noise["samples"] for p in every_step] == [100, 600]
    assert [p.noise["samples"] for p in one_in_ten] == [10, 60]  # steps 1, 11, … 591
    # measuring every step, the stationary truth (50) is read and covered
    assert every_step[-1].ratio == pytest.approx(1.0, abs=0.05) and every_step[-1].covered
    # ten measured steps are too few for an estimate: none, rather than a guess
    assert one_in_ten[0].live is None
    summary = ceiling.ceiling([recording], 1)
    assert summary.counted == 2 and summary.median == pytest.approx(1.0, abs=0.05)


def regression_task() -> object:
    torch.manual_seed(0)
    x = torch.randn(512, 6)
    y = x @ torch.linspace(-1, 1, 6) + 0.5 * torch.randn(512)
    mse = lambda out, target: 0.5 * (out.squeeze(-1) - target).square().mean()  # noqa: E731
    return tasks.TrackingTask(
        "regression",
        "a linear regression",
        lambda: pairs(x, y),
        lambda: nn.Linear(6, 1),
        lambda model, batch: torch.optim.SGD(model.parameters(), lr=0.05),
        mse,
        examples=256,
    )


def test_the_recording_holds_each_steps_batch_at_its_weights_and_trains_as_without() -> None:
    task = regression_task()
    found = ceiling.record(task, seed=3, batch=16, steps=40, examples=256)
    assert len(found.steps) == 40 and sorted(found.exact) == [32, 40]

    # the same run by hand: each step's sums from its own batch's per-example gradients
    job = task.job(3, 16)
    for step in range(40):
        x, y = next(job.batches)
        rows = []
        for xi, yi in zip(x, y, strict=True):
            job.model.zero_grad()
            task.loss(job.model(xi[None]), yi[None]).backward()
            rows.append(torch.cat([p.grad.flatten() for p in job.model.parameters()]))
        g = torch.stack(rows).double()
        mean = g.mean(0)
        assert found.steps[step].total == pytest.approx(float(mean @ mean), rel=1e-4)
        assert found.steps[step].squares == pytest.approx(float((g / 16).square().sum()), rel=1e-4)
        job.optimizer.zero_grad(set_to_none=True)
        task.loss(job.model(x), y).backward()
        job.optimizer.step()
    # recording changed nothing of the training: the exact value at the end is the same model's
    inputs, labels = task.fixed_set(256)
    at_end = exact.exact_noise(job.model, task.loss, inputs, labels)
    assert found.exact[40].b_simple == pytest.approx(at_end.b_simple, rel=1e-5)
