"""The noise-scale estimators against the closed-form truth of a linear regression.

Learning rate 0 keeps the truth fixed; every step draws fresh data. Each run measures every
step (``noise_budget=None``) and asserts the smoothed B_simple within 10% of the truth, and
that the reported uncertainty is honest (the truth within 4 standard errors of the estimate).
"""

from __future__ import annotations

import pytest
import torch

from bsmon.probes.noise.tracker import NEGATIVE_G2
from workloads.noise_jobs import (
    ANISO,
    ANISO_BIAS,
    ISO,
    ISO_BIAS,
    NOTE_MAIN,
    Case,
    Regression,
    measuring,
    train,
)

BATCH = 128


def estimate(
    case: Case, *, steps: int = 2000, batch: int = BATCH, seed: int = 0, **options
) -> dict:
    torch.manual_seed(seed)
    job = Regression(case, seed=seed)
    optimizer = torch.optim.SGD(job.model.parameters(), lr=0.0)
    train_options = {
        k: options.pop(k) for k in ("micro", "reduction", "divide_by_micro") if k in options
    }
    options.setdefault("noise_window", steps)
    with measuring(job.model, optimizer, batch, **options) as mon:
        train(job, optimizer, steps=steps, batch=batch, **train_options)
        assert mon.flush()
        stats = mon.stats()
    assert stats["errors"] == 0
    return stats["noise"]


def assert_close_to_truth(noise: dict, case: Case) -> None:
    truth = case.truth()
    b = noise["b_simple"]
    assert b is not None, noise
    assert abs(b - truth) <= 0.10 * truth, f"B_simple {b:.2f} vs truth {truth:.2f} ({noise})"
    assert abs(b - truth) <= 4 * noise["stderr"], f"stderr {noise['stderr']:.3f} too small"
    assert noise["ci_low"] < b < noise["ci_high"]


@pytest.mark.parametrize(
    "case, reduction",
    [
        (ISO, "mean"),
        (ISO_BIAS, "sum"),
        (ANISO, "sum"),
        (ANISO_BIAS, "mean"),
    ],
    ids=lambda v: v.name if isinstance(v, Case) else v,
)
def test_per_example(case, reduction):
    noise = estimate(case, reduction=reduction)
    assert noise["estimator"] == "per_example" and noise["coverage"] == 1.0
    assert not noise.get("biased", False)
    # every step but the first (forward hooks are registered once the first step is over)
    assert noise["samples"] == 1999 and noise.get("skipped_steps", 0) == 0
    assert_close_to_truth(noise, case)


def test_per_example_reproduces_the_research_note_value():
    """B_simple = 111 exactly (note §7.2): the noise-dominated regime, B_simple ≈ 1.7·B."""
    noise = estimate(NOTE_MAIN, steps=5000, batch=64)
    assert_close_to_truth(noise, NOTE_MAIN)


@pytest.mark.parametrize(
    "case, reduction, divide",
    [
        (ISO, "mean", True),
        (ISO_BIAS, "mean", False),  # micro-batch losses not divided by the count: still right
        (ANISO, "sum", False),
        (ANISO_BIAS, "sum", False),
    ],
    ids=lambda v: v.name if isinstance(v, Case) else str(v),
)
def test_four_accumulated_micro_batches(case, reduction, divide):
    noise = estimate(case, steps=1500, micro=4, reduction=reduction, divide_by_micro=divide)
    assert noise["estimator"] == "microbatch", noise  # auto switched on seeing accumulation
    assert noise["detail"].startswith("4 micro-batches")
    assert_close_to_truth(noise, case)


def test_forced_per_example_under_accumulation_uses_every_example():
    noise = estimate(ANISO, steps=1500, micro=4, noise_scale="per_example")
    assert noise["estimator"] == "per_example"
    assert_close_to_truth(noise, ANISO)


def test_sequential_is_marked_biased_and_agrees_at_learning_rate_zero():
    """With lr 0 no update lies between the steps, so even the sequential pairing is right."""
    noise = estimate(ISO, noise_scale="sequential")
    assert noise["estimator"] == "sequential" and noise["biased"] is True
    assert_close_to_truth(noise, ISO)


def test_sequential_is_biased_once_the_model_learns():
    """SGD at stationarity (lr 0.5): the per-example estimate follows the truth of the moving
    weights, while the sequential pairing's |G|² comes out ≈ −|G|², as E[g₁·g₂] =
    |G|²(1 − ε/ε_opt) predicts (note §6.3, MC part C2): it has no estimate to show."""
    results = {}
    for mode, steps in (("per_example", 3000), ("sequential", 1000)):
        torch.manual_seed(1)
        job = Regression(NOTE_MAIN, seed=1)
        optimizer = torch.optim.SGD(job.model.parameters(), lr=0.5)
        train(job, optimizer, steps=300, batch=BATCH)  # reach stationarity
        xs, ys = job.batches(steps, BATCH)
        trace = g2 = 0.0
        with measuring(
            job.model,
            optimizer,
            BATCH,
            noise_scale=mode,
            noise_window=10**6,  # ≈ a plain mean over the run, like the truth below
        ) as mon:
            for t in range(steps):
                delta = job.model.weight.detach()[0].double() - 1.0
                g2 += float(delta @ delta)  # exact |G|² and tr Σ at this step's weights
                trace += 11 * float(delta @ delta) + 10
                loss = 0.5 * (job.model(xs[t]).squeeze(-1) - ys[t]).square().mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            assert mon.flush()
            results[mode] = mon.stats()["noise"]
    truth = trace / g2
    per_example, sequential = results["per_example"], results["sequential"]
    assert abs(per_example["b_simple"] - truth) <= 0.1 * truth, (per_example, truth)
    assert sequential["biased"] and sequential.get("b_simple") is None, sequential
    assert sequential["note"] == NEGATIVE_G2  # says why there is nothing to show
