"""The autopilot against fixed batches: time to a target loss on three small CPU tasks.

The protocol of research/autopilot.md §7, on the tasks of ``autopilot_kit.tasks`` (T1: synthetic
10-class classification with an MLP; T2: a character-level model of the Python standard
library's own sources, both with SGD and momentum 0.9; T3: a small decoder transformer on a
Markov chain's sequences with AdamW; no download, one thread):

1. **This machine's step time** t(B) at B0·2^k, k = 0…6, fitted by t(B) = t0 + c·B (B½ = t0/c).
2. **Fixed batches** B ∈ {B0, 4·B0, 16·B0, 64·B0}, each with its learning rate tuned on a ×2
   grid of 5 values (extended past an edge that wins) on tuning seeds 0–1, disjoint from the
   evaluation seeds (10, 11, …): the rate that reaches the last target in the fewest steps
   (median over the tuning seeds; a seed that does not reach it counts as never).
3. **Warm-up baselines** for the two largest batches: the rate rises linearly from 0 over W
   examples, W = the examples the autopilot (run on the tuning seeds) needed before it first
   reached that batch (the task's default when it never did); the peak rate tuned on
   {1, 2, 4}× the batch's own rate, extended past an edge that wins.
4. **The autopilot**: bsmon's ``attach(..., batch_size=B0, autopilot=True,
   max_batch_size=64·B0)`` with B0's tuned rate only, batches from ``mon.dataloader``; once
   with B½ fitted from the job's own step times (the wall-clock row) and once for each
   declared B½ ∈ {16, 64, 256, 1024} (the simulated columns).
5. **The fastest ramps** (a bound, not a goal): no monitor, the batch B0 for the autopilot's
   first ``WARMUP_STEPS`` steps, then doubled every ``SETTLE_STEPS`` (its fastest legal
   pace, 2× per decision) up to 8·B0 … 64·B0 and held there, B0's rate moved with it by
   bsmon's rule for the task's optimizer, and the Adam rules (``--adam``) applied at each
   change by bsmon's own functions. A ramp to S is the best any autopilot with these guards
   could do had it known from the start that S is the size to steer to; B_simple's model
   picks S = the doubling where the goodput gain stops paying (docs/benchmarks.md reads it
   with the exact B_simple).

Every arm runs on each evaluation seed (arms interleaved within a seed) until the held-out
loss reaches the task's last target. Time to a target is interpolated linearly between the
two evaluations around it. Printed per task and target, medians over the seeds: steps,
examples, training wall-clock with its interquartile range, and the **simulated time**
Σ_k (B½ + B_k) (a GPU-like step time t(B) = c·(B½ + B), in units of c; deterministic given
the batch trajectory, so this machine's noise does not decide it) as the ratio of the best
fixed batch's to the run's (> 1: faster than the best fixed batch) at each B½, and at this
machine's fitted B½ ("CPU"). The autopilot's simulated column at a B½ comes from the run that
declared that B½ (its other columns are printed for reference).

Goals (met / not met; research/autopilot.md §7's C1–C4):

- **robust**: every autopilot run reaches every target; no NaN or infinite learning rate; no
  batch above the ceiling 64·B0;
- **vs start, simulated**: ≥ 2× the simulated time-to-target of the fixed B0 at B½ = 64, on
  every task; **vs start, wall**: ≥ 1.5× its wall-clock (the autopilot with measured B½);
- **vs best fixed**: ≥ 0.8× the best tuned fixed batch (warm-up baselines included) at each
  B½ ≤ 256 (B½ = 1024 is printed, not gated);
- **honest claim**: the gain the autopilot claims against its start batch (its own live
  figure, median over seeds) within ±25% of the gain measured (fixed B0's median wall-clock
  over the autopilot's);
- **own cost** (``--cost``, apart): the noise scale on its budget and the autopilot's looks
  together ≤ 3% of the step time at 4·B0 (bsmon with both, held at that size, against bsmon
  with the noise scale off; the three jobs in one process taking turns, 100 steps at a time;
  the median of 12 rounds' paired ratios).

    python benchmarks/autopilot.py                                  # three tasks, 5 seeds
    python benchmarks/autopilot.py --quick                          # a smoke run (~3 min)
    python benchmarks/autopilot.py --write-lr-table /tmp/lr.json    # keep the tuning ...
    python benchmarks/autopilot.py --lr-table /tmp/lr.json          # ... and skip it next time
    python benchmarks/autopilot.py --tasks charlm --seeds 3
    python benchmarks/autopilot.py --cost                           # goal C5 alone (~2 min)
    python benchmarks/autopilot.py --lag                            # the noise scale's lag
    python benchmarks/autopilot.py --tasks transformer --adam reset/examples/timescale
    python benchmarks/autopilot.py --tasks transformer --arms fixed auto --switch-on 800

Progress goes to stderr, the tables and verdicts to stdout. Figures are printed, never
asserted (docs/benchmarks.md keeps them).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autopilot_kit.outcomes import TaskOutcome, median, quantile
from autopilot_kit.protocol import Settings, calibrate, evaluate, lr_table, say
from autopilot_kit.verdicts import HALVES, goals, table, verdict_lines

COST_GOAL = 0.03  # the autopilot's estimate and decisions, of the step time
TUNING_SEEDS = (0, 1)
FIRST_EVAL_SEED = 10
LR_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)
WARMUP_FACTORS = (1.0, 2.0, 4.0)
EXTENSIONS = 2  # grid steps added past a winning edge, at most


def cost(names: Sequence[str]) -> int:
    """Goal C5: the autopilot's estimate and decisions together ≤ 3% of the step time."""
    from autopilot_kit.costs import COST_CONFIGS, autopilot_cost
    from autopilot_kit.tasks import TASKS

    off, noise, on = COST_CONFIGS
    for name in names:
        task = TASKS[name]
        size = 4 * task.start_batch
        rounds = autopilot_cost(task, size)
        times = rounds.step_s
        both, estimate = _paired(times[on], times[off]), _paired(times[noise], times[off])
        looks = _paired(times[on], times[noise])
        verdict = "met" if median(both) <= COST_GOAL else "NOT MET"
        print(
            f"{name} at batch {size}, {len(both)} rounds: a step {median(times[off]) * 1e3:.3f} "
            f"ms with the noise scale off; the estimate and the looks together "
            f"{_share(both)} [{verdict}: ≤ {COST_GOAL:.0%}]; the estimate alone "
            f"{_share(estimate)}; the looks alone {_share(looks)}, their own CPU time on the "
            f"agent thread {median(rounds.looks_share):.3%} of the wall time",
            flush=True,
        )
    return 0


def _paired(runs: Sequence[float], bases: Sequence[float]) -> list[float]:
    """Each round's change from its base."""
    return [run / base - 1 for run, base in zip(runs, bases, strict=True)]


def _share(changes: Sequence[float]) -> str:
    """The median paired change with its interquartile range."""
    low, high = quantile(changes, 0.25), quantile(changes, 0.75)
    return f"{median(changes):+.1%} [{low:+.1%}…{high:+.1%}]"


LAG_CHECKPOINTS = [100, 200, 400, 800, 1600, 3200]


def lag(names: Sequence[str]) -> int:
    """How far behind the truth the live noise scale is on runs this short: each task's 4·B0,
    fixed, its own tuned rate, seed 10."""
    from autopilot_kit.lag import noise_lag
    from autopilot_kit.tasks import TASKS

    for name in names:
        task = TASKS[name]
        batch = 4 * task.start_batch
        rows = noise_lag(task, batch, task.lr_centre[batch], FIRST_EVAL_SEED, LAG_CHECKPOINTS)
        print(
            f"{name} at batch {batch}: B_simple exact (16,384 examples) at the step / over the "
            "last quarter of the run (the ratio of the means at 8 steps) / the live estimate"
        )
        for row in rows:
            shown = f"{row.live:,.0f}" if row.live is not None else "none"
            ratio = f" ({row.live / row.window:.2f}× the window's)" if row.live else ""
            print(
                f"  step {row.step:>5,}: {row.point:>7,.0f} / {row.window:>7,.0f} / {shown}{ratio}",
                flush=True,
            )
    return 0


def _adam_rules(parser: argparse.ArgumentParser, given: str | None) -> tuple[str, str, str] | None:
    """``--adam`` as the three rules, checked by bsmon's own ``AdamRules``."""
    if given is None:
        return None
    from bsmon.probes.batch.adam_rules import AdamRules

    parts = given.split("/")
    if len(parts) != 3:
        parser.error(f"--adam takes MOMENTS/BETA2/DECAY, got {given!r}")
    try:
        AdamRules(*parts)
    except ValueError as exc:
        parser.error(f"--adam: {exc}")
    return parts[0], parts[1], parts[2]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["synthetic", "charlm", "transformer"])
    parser.add_argument("--seeds", type=int, default=None, help="evaluation seeds (default 5)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 seed, small budgets")
    parser.add_argument("--lr-table", type=Path, help="reuse a tuning (JSON from --write-lr-table)")
    parser.add_argument("--write-lr-table", type=Path, help="write the tuning here as JSON")
    parser.add_argument(
        "--cost",
        action="store_true",
        help="only the autopilot's own cost (its estimate and decisions) at 4·B0, per task",
    )
    parser.add_argument(
        "--lag",
        action="store_true",
        help="only the live noise scale against the exact one at checkpoints of a fixed 4·B0 "
        "(at the checkpoint, and over the last quarter of the run before it)",
    )
    parser.add_argument(
        "--noise-budget",
        type=float,
        metavar="SHARE",
        help="a what-if: the autopilot's noise-scale budget as a share of the step (bsmon's "
        "default is 0.01); the simulated time leaves the measuring's cost out, wall-clock keeps it",
    )
    parser.add_argument(
        "--adam",
        metavar="MOMENTS/BETA2/DECAY",
        help="a what-if for the autopilot's and the ramps' changes: attach's adam_moments, "
        "adam_beta2 and adam_weight_decay, e.g. reset/examples/timescale (default: bsmon's)",
    )
    parser.add_argument(
        "--arms",
        nargs="+",
        choices=("fixed", "warmup", "ramp", "auto"),
        default=["fixed", "warmup", "ramp", "auto"],
        help="the kinds of arm evaluated (a what-if of --adam needs only ramp and auto: the "
        "fixed batches never change size); the tuning runs whatever it needs",
    )
    parser.add_argument(
        "--switch-on",
        type=int,
        default=0,
        metavar="STEP",
        help="a what-if: the autopilot attached off and switched on at this step, as the `a` "
        "key does; its claim is judged against the fixed start batch from there",
    )
    args = parser.parse_args(argv)
    if args.switch_on < 0:
        parser.error(f"--switch-on takes a step ≥ 0, got {args.switch_on}")
    adam = _adam_rules(parser, args.adam)
    if args.noise_budget is not None and not 0 < args.noise_budget <= 1:
        parser.error(f"--noise-budget must be a share in (0, 1], got {args.noise_budget:g}")

    import torch
    from autopilot_kit.tasks import TASKS

    torch.set_num_threads(1)
    unknown = [name for name in args.tasks if name not in TASKS]
    if unknown:
        parser.error(f"unknown task(s) {unknown}; choose from {sorted(TASKS)}")
    if args.cost:
        return cost(args.tasks)
    if args.lag:
        return lag(args.tasks)
    seeds = args.seeds or (2 if args.quick else 5)
    reused = json.loads(args.lr_table.read_text()) if args.lr_table else {}
    table_out: dict[str, Any] = {}
    outcomes = []
    started = time.perf_counter()
    for name in args.tasks:
        task = TASKS[name]
        settings = Settings(
            targets=task.quick_targets if args.quick else task.targets,
            budget=task.quick_budget_examples if args.quick else task.budget_examples,
            eval_seeds=list(range(FIRST_EVAL_SEED, FIRST_EVAL_SEED + seeds)),
            tuning_seeds=TUNING_SEEDS[:1] if args.quick else TUNING_SEEDS,
            lr_factors=(0.5, 1.0, 2.0) if args.quick else LR_FACTORS,
            warmup_factors=(1.0, 2.0) if args.quick else WARMUP_FACTORS,
            extensions=0 if args.quick else EXTENSIONS,
            halves=(None, 64) if args.quick else (None, *HALVES),
            ramp_tops=tuple(
                task.start_batch * 2**k for k in ((4,) if args.quick else (3, 4, 5, 6))
            ),
            noise_budget=args.noise_budget,
            adam=adam,
            kinds=tuple(args.arms),
            switch_on=args.switch_on,
        )
        say(f"{task.title}: targets {settings.targets}, B0 {task.start_batch}")
        t0, c = calibrate(task)
        if name in reused:
            entry = reused[name]
            say(f"  [{name}] learning rates from {args.lr_table}")
        else:
            entry = lr_table(task, settings)
        table_out[name] = entry
        print(f"{name}: learning rates {json.dumps(entry)}", flush=True)
        arms = evaluate(task, entry, settings)
        outcome = TaskOutcome(
            name, task.start_batch, task.ceiling, settings.targets, arms, cpu_half=t0 / c
        )
        outcomes.append(outcome)
        for target in settings.targets:
            print("\n".join(table(outcome, target)), flush=True)
        say(f"  [{name}] done after {time.perf_counter() - started:.0f} s")
    if args.write_lr_table:
        args.write_lr_table.write_text(json.dumps(table_out, indent=1) + "\n")
    print(f"lr table: {json.dumps(table_out)}")
    print("goals (at each task's last target):")
    print("\n".join(verdict_lines(goals(outcomes))))
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
