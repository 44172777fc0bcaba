"""B_simple at bsmon's defaults: how soon it shows, how right it is, how honest its error is.

Three parts, each printed as a table (docs/benchmarks.md keeps the figures):

1. **Warm-up**: the demo's CNN and a GPT-style model (the corpus's nanoGPT-like one) train at
   the defaults; the step at which the estimate first reaches a relative standard error of
   20% (the warm-up ends: every step measured until then) and what it reads there.
2. **Closed form**: linear regressions whose B_simple is known exactly (learning rate 0,
   fresh data every step, workloads/noise_jobs.py) train 3,000 steps at the defaults — one
   device, 4 micro-batches, 2 DDP ranks over gloo, and a batch size that doubles halfway —
   and the estimate is compared with the truth (goal: within 10%).
3. **Sequential calibration**: 16 seeds of the sequential estimator at learning rate 0: the
   spread of the estimates against the standard error it reports (goal: ratio ≈ 1).
4. **Drift**: the closed-form regression with its offset from the optimum shrinking, so the
   true B_simple doubles every ``DRIFT_DOUBLING`` steps; at checkpoints the estimate at the
   defaults, at a 5% budget and measuring every step against the truth at that step, and how
   many steps behind the truth it reads.

    python benchmarks/noise_accuracy.py [--part warmup closed sequential drift] [--seeds 16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "corpus"))

from gpt import GPT  # noqa: E402

from bsmon.probes import attach  # noqa: E402
from bsmon.probes.demo import DemoCNN, make_dataset  # noqa: E402
from workloads.noise_jobs import ISO, ISO_BIAS, Case, Regression, train  # noqa: E402

WARMUP_STEPS = 300  # the goal: a first estimate with ±20% within this many steps
CLOSED_STEPS = 3000
DRIFT_STEPS, DRIFT_EVERY, DRIFT_DOUBLING = 6000, 500, 3000


def warm_up(name: str, model: nn.Module, batches: Callable[[], tuple], loss: Callable) -> dict:
    """Train at the defaults until the warm-up ends; the step it ended at and the reading."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with attach(model, optimizer, record=False, serve=False, name=name) as mon:
        ended = None
        for step in range(1, 2 * WARMUP_STEPS + 1):
            loss(model, *batches()).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if ended is None and mon._noise.phase == "tracking":
                ended = step
                assert mon.flush()
                noise = mon.stats()["noise"]
            if ended is not None and step >= ended + 1:
                break
        if ended is None:
            assert mon.flush()
            noise = mon.stats()["noise"]
    b, se = noise["b_simple"], noise["stderr"]
    return {
        "model": name,
        "warm-up ended at step": ended,
        "B_simple": b,
        "rse": se / b if b and se else None,
        "estimator": noise["estimator"],
    }


def demo_case() -> tuple[nn.Module, Callable[[], tuple], Callable]:
    torch.manual_seed(0)
    data = make_dataset(20_000)
    generator = torch.Generator().manual_seed(1)

    def batches() -> tuple:
        ix = torch.randint(len(data), (64,), generator=generator)
        return data.tensors[0][ix], data.tensors[1][ix]

    return DemoCNN(), batches, lambda m, x, y: nn.functional.cross_entropy(m(x), y)


def gpt_case() -> tuple[nn.Module, Callable[[], tuple], Callable]:
    torch.manual_seed(0)
    text = torch.randint(0, 20, (20_000,))
    block, batch = 32, 12

    def batches() -> tuple:
        ix = torch.randint(len(text) - block - 1, (batch,))
        x = torch.stack([text[i : i + block] for i in ix])
        return x, torch.stack([text[i + 1 : i + 1 + block] for i in ix])

    return GPT(vocab=20, block=block), batches, lambda m, x, y: m(x, y)


def closed_form_local(micro: int, change_at: int | None) -> dict:
    """One device at the defaults (per-example, or micro-batches when ``micro`` > 1)."""
    torch.manual_seed(0)
    job = Regression(ISO, seed=0)
    optimizer = torch.optim.SGD(job.model.parameters(), lr=0.0)
    with attach(job.model, optimizer, record=False, serve=False) as mon:
        if change_at is None:
            train(job, optimizer, steps=CLOSED_STEPS, batch=128, micro=micro)
        else:  # the batch size doubles halfway
            train(job, optimizer, steps=change_at, batch=128, micro=micro)
            train(job, optimizer, steps=CLOSED_STEPS - change_at, batch=256, micro=micro)
        assert mon.flush()
        noise = mon.stats()["noise"]
    return {**noise, "truth": ISO.truth(), "share": mon._noise.budget.share}


def closed_form_ddp() -> list[dict]:
    """Two gloo ranks at the defaults (tests/noise_ddp_worker.py --defaults)."""
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{tmp}/rendezvous"
        worker = str(ROOT / "tests" / "noise_ddp_worker.py")
        args = ["--init", init, "--case", "iso+bias", "--defaults"]
        procs = [
            subprocess.Popen(
                [sys.executable, worker, "--rank", str(rank), *args],
                stdout=subprocess.PIPE,
                text=True,
                env={**os.environ, "BSMON_DIR": tmp},
            )
            for rank in range(2)
        ]
        outs = [proc.communicate(timeout=600)[0] for proc in procs]
    results = [json.loads(out.strip().splitlines()[-1]) for out in outs]
    return [{**r["noise"], "truth": ISO_BIAS.truth(), "share": None} for r in results]


def sequential_calibration(seeds: int) -> dict:
    """The spread of 16 sequential estimates against the standard error they report."""
    values, errors = [], []
    for seed in range(seeds):
        torch.manual_seed(seed)
        job = Regression(ISO, seed=seed)
        optimizer = torch.optim.SGD(job.model.parameters(), lr=0.0)
        options = {"noise_scale": "sequential", "noise_budget": None, "noise_window": 10**6}
        with attach(job.model, optimizer, record=False, serve=False, **options) as mon:
            train(job, optimizer, steps=2000, batch=128)
            assert mon.flush()
            noise = mon.stats()["noise"]
        values.append(noise["b_simple"])
        errors.append(noise["stderr"])
    spread = statistics.stdev(values)
    reported = statistics.mean(errors)
    return {
        "seeds": seeds,
        "spread": spread,
        "reported": reported,
        "ratio": spread / reported,
        "mean": statistics.mean(values),
        "truth": ISO.truth(),
    }


def drifting_case(step: int) -> Case:
    """ISO with |δ|² halving every ``DRIFT_DOUBLING`` steps: B_simple ≈ 11 + 10/|δ|²."""
    shrink = 0.5 ** (step / DRIFT_DOUBLING / 2)
    return Case("drift", c=ISO.c, delta=tuple(d * shrink for d in ISO.delta))


def steps_behind(step: int, estimate: float) -> int:
    """How many steps ago the truth was ``estimate`` (truth rises with the step)."""
    earlier = next((s for s in range(step, -1, -1) if drifting_case(s).truth() <= estimate), 0)
    return step - earlier


def drift(**options: Any) -> list[dict]:
    """The estimate at each checkpoint while the truth drifts (lr 0; the offset is set);
    ``options`` for ``attach`` (none: the defaults)."""
    torch.manual_seed(0)
    job = Regression(ISO, seed=0)
    optimizer = torch.optim.SGD(job.model.parameters(), lr=0.0)
    rows = []
    with attach(job.model, optimizer, record=False, serve=False, **options) as mon:
        xs, ys = job.batches(DRIFT_STEPS, 128)
        for step in range(DRIFT_STEPS):
            with torch.no_grad():
                delta = torch.tensor(drifting_case(step).delta)
                job.model.weight.copy_(job.w_star + delta)
            loss = 0.5 * (job.model(xs[step]).squeeze(-1) - ys[step]).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if (step + 1) % DRIFT_EVERY == 0:
                assert mon.flush()
                noise = mon.stats()["noise"]
                truth = drifting_case(step).truth()
                b = noise["b_simple"]
                rows.append(
                    {
                        "step": step + 1,
                        "truth": truth,
                        "b_simple": b,
                        "stderr": noise["stderr"],
                        "ci": (noise["ci_low"], noise["ci_high"]),
                        "behind": steps_behind(step, b) if b is not None else None,
                        "share": measured_share(mon),
                        "detail": noise["detail"],
                    }
                )
    return rows


def measured_share(mon: object) -> float | None:
    """The share of steps the estimator measures lately (None: it does not say)."""
    budget = getattr(getattr(mon, "_noise", None), "budget", None)
    return getattr(budget, "share", None)


def fmt(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--part", nargs="+", default=["warmup", "closed", "sequential"], help="which parts"
    )
    parser.add_argument("--seeds", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, defaults (noise budget 1%, window 1000)\n")
    if "warmup" in args.part:
        print("| model | warm-up ended at step | B_simple | rel. std. error | estimator |")
        print("|---|---|---|---|---|")
        for name, case in (("demo CNN", demo_case), ("GPT-style", gpt_case)):
            r = warm_up(name, *case())
            print(
                f"| {name} | {r['warm-up ended at step']} | {fmt(r['B_simple'])} | "
                f"{fmt(r['rse'], 2)} | {r['estimator']} |"
            )
        print()
    if "closed" in args.part:
        rows = [
            ("one device, per example", closed_form_local(1, None)),
            ("4 micro-batches", closed_form_local(4, None)),
            ("batch 128 → 256 at step 1500", closed_form_local(1, CLOSED_STEPS // 2)),
        ] + [(f"DDP rank {i}, 2 ranks", r) for i, r in enumerate(closed_form_ddp())]
        print(f"| case ({CLOSED_STEPS} steps) | B_simple | truth | error | ± | measured steps |")
        print("|---|---|---|---|---|---|")
        for name, r in rows:
            b, truth = r["b_simple"], r["truth"]
            error = f"{(b - truth) / truth:+.1%}" if b is not None else "n/a"
            print(
                f"| {name} | {fmt(b)} | {fmt(truth)} | {error} | {fmt(r['stderr'], 2)} | "
                f"{r['samples']} |"
            )
        print()
    if "sequential" in args.part:
        r = sequential_calibration(args.seeds)
        print("| sequential, lr 0 | seeds | mean | truth | spread | reported ± | ratio |")
        print("|---|---|---|---|---|---|---|")
        print(
            f"| ISO | {r['seeds']} | {fmt(r['mean'])} | {fmt(r['truth'])} | "
            f"{fmt(r['spread'], 2)} | {fmt(r['reported'], 2)} | {r['ratio']:.2f} |"
        )

    if "drift" in args.part:
        budgets = {
            "defaults": {},
            "budget 5%": {"noise_budget": 0.05},
            "every step": {"noise_budget": None},
        }
        runs = {name: drift(**options) for name, options in budgets.items()}
        print(f"True B_simple doubling every {DRIFT_DOUBLING} steps (ISO, batch 128):\n")
        print("| step | truth | " + " | ".join(runs) + " |")
        print("|---|---|" + "---|" * len(runs))
        for rows in zip(*runs.values(), strict=True):
            cells = [f"{fmt(r['b_simple'])} ({_error(r)}, {r['behind']} behind)" for r in rows]
            print(f"| {rows[0]['step']} | {fmt(rows[0]['truth'])} | " + " | ".join(cells) + " |")
        print()
        for name, rows in runs.items():
            last = rows[-1]
            share = "n/a" if last["share"] is None else f"{last['share']:.1%}"
            print(f"{name}: {share} of steps measured; {last['detail']}")


def _error(row: dict) -> str:
    b = row["b_simple"]
    return f"{(b - row['truth']) / row['truth']:+.1%}" if b is not None else "n/a"


if __name__ == "__main__":
    main()
