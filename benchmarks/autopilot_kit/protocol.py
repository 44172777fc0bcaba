"""The protocol of benchmarks/autopilot.py, run arm by arm (torch and bsmon are imported only
when a run starts): the learning rates tuned on the tuning seeds, the autopilot's ramp that
sets the warm-up baselines, this machine's step time, and every arm on the evaluation seeds."""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .outcomes import ArmResult, fit_step_time, median, reduce_run, time_to_target

MAX_RUN_S = 120.0  # a run's training wall-clock cap


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class Settings:
    targets: tuple[float, ...]
    budget: int
    eval_seeds: list[int]
    tuning_seeds: tuple[int, ...]
    lr_factors: tuple[float, ...]
    warmup_factors: tuple[float, ...]
    extensions: int
    halves: tuple[float | None, ...]
    ramp_tops: tuple[int, ...]
    noise_budget: float | None = None  # a what-if for the autopilot's arms (None: bsmon's)
    adam: tuple[str, str, str] | None = None  # a what-if for the autopilot's and ramps' changes
    kinds: tuple[str, ...] = ("fixed", "warmup", "ramp", "auto")  # the arms run
    switch_on: int = 0  # a what-if: the autopilot switched on at this step, not at attach


def run_once(task: Any, arm: Any, seed: int, settings: Settings) -> Any:
    from .training import train

    started = time.perf_counter()
    log = train(
        task,
        arm,
        seed,
        target=settings.targets[-1],
        budget_examples=settings.budget,
        max_wall_s=MAX_RUN_S,
    )
    reach = time_to_target(log.evals, settings.targets[-1])
    where = (
        f"reached {settings.targets[-1]:g} at {reach.examples / 1000:.0f}k examples, "
        f"{reach.steps:.0f} steps, {reach.wall_s:.2f} s"
        if reach
        else f"stopped ({log.stopped}) at {log.examples / 1000:.0f}k examples, "
        f"loss {log.evals[-1][3]:.3f}"
    )
    extra = ""
    if arm.autopilot:
        before = log.claimed_seen if log.claimed_gain is None else None
        extra = (
            f"; autopilot {log.state}, {len(log.decisions)} decisions, end batch "
            f"{log.monitor_sizes[-1] if log.monitor_sizes else '?'}, claimed "
            f"{'none' if log.claimed_gain is None else f'{log.claimed_gain:.2f}×'} at the end"
            f"{f' ({before:.2f}× before)' if before else ''}"
            f"{f' ({log.why})' if log.why else ''}"
        )
    say(
        f"  [{task.name}] {arm.label} lr {arm.lr:.3g} seed {seed}: {where}{extra} "
        f"({time.perf_counter() - started:.1f} s)"
    )
    return log


def tune(
    task: Any,
    what: str,
    make: Callable[[float], Any],
    centre: float,
    factors: Sequence[float],
    settings: Settings,
) -> tuple[float, dict[float, float]]:
    """The rate on the ×2 grid ``centre × factors`` that reaches the last target in the fewest
    steps (median over the tuning seeds, unreached = ∞; ties: the lower final loss), the grid
    extended past a winning edge up to ``settings.extensions`` times."""
    scores: dict[float, tuple[float, float]] = {}

    def score(lr: float) -> tuple[float, float]:
        if lr not in scores:
            steps, finals = [], []
            for seed in settings.tuning_seeds:
                log = run_once(task, make(lr), seed, settings)
                reach = time_to_target(log.evals, settings.targets[-1])
                steps.append(math.inf if reach is None else reach.steps)
                finals.append(log.evals[-1][3] if math.isfinite(log.evals[-1][3]) else math.inf)
            scores[lr] = (median(steps), statistics.fmean(finals))
        return scores[lr]

    grid = sorted(round(centre * f, 6) for f in factors)
    for lr in grid:
        score(lr)
    for _ in range(settings.extensions):
        best = min(scores, key=lambda lr: scores[lr])
        if best == max(scores):
            score(round(best * 2, 6))
        elif best == min(scores):
            score(round(best / 2, 6))
        else:
            break
    best = min(scores, key=lambda lr: scores[lr])
    say(
        f"  [{task.name}] {what}: lr {best:.3g} ("
        + ", ".join(f"{lr:.3g}: {s[0]:.0f} steps" for lr, s in sorted(scores.items()))
        + ")"
    )
    return best, {lr: s[0] for lr, s in scores.items()}


def lr_table(task: Any, settings: Settings) -> dict[str, Any]:
    """Tune the fixed batches, measure the autopilot's ramp on the tuning seeds, tune the
    warm-up baselines; the table as JSON-ready dicts."""
    from .training import Arm

    fixed = {}
    for batch in task.batches:
        fixed[batch], _ = tune(
            task,
            f"fixed {batch}",
            lambda lr, b=batch: Arm(b, lr),
            task.lr_centre[batch],
            settings.lr_factors,
            settings,
        )
    ramps = [
        run_once(task, Arm(task.start_batch, fixed[task.start_batch], autopilot=True), s, settings)
        for s in settings.tuning_seeds
    ]
    warmup = {}
    for batch in task.batches[-2:]:
        reached = [r.first_reach(batch) for r in ramps]
        if all(r is not None for r in reached):
            examples = int(median([float(r) for r in reached if r is not None]))
            how = "the autopilot's ramp"
        else:
            examples, how = task.warmup_default[batch], "default: the autopilot did not reach it"
        examples = max(examples, task.start_batch)
        say(f"  [{task.name}] warm-up for {batch}: {examples} examples ({how})")
        lr, _ = tune(
            task,
            f"fixed {batch} + warm-up",
            lambda lr, b=batch, w=examples: Arm(b, lr, warmup_examples=w),
            fixed[batch],
            settings.warmup_factors,
            settings,
        )
        warmup[batch] = [lr, examples]
    return {
        "fixed": {str(b): lr for b, lr in fixed.items()},
        "warmup": {str(b): v for b, v in warmup.items()},
    }


def calibrate(task: Any) -> tuple[float, float]:
    from .costs import step_times

    times = step_times(task, [task.start_batch * 2**k for k in range(7)])
    t0, c = fit_step_time(times)
    print(
        f"{task.name}: this machine's step time, 1 thread: "
        + ", ".join(f"t({b}) = {t * 1e3:.2f} ms" for b, t in times.items())
        + f"; fit t0 = {t0 * 1e3:.3f} ms, c = {c * 1e6:.2f} µs/example, B½ = {t0 / c:.0f}",
        flush=True,
    )
    return t0, c


def evaluate(task: Any, table_entry: Mapping[str, Any], settings: Settings) -> list[ArmResult]:
    from .training import Arm

    fixed = {int(b): float(lr) for b, lr in table_entry["fixed"].items()}
    warmup = {int(b): (float(v[0]), int(v[1])) for b, v in table_entry["warmup"].items()}
    arms: list[tuple[ArmResult, Any]] = []
    for batch in task.batches:
        arms.append(
            (ArmResult(f"fixed {batch}", "fixed", batch, fixed[batch]), Arm(batch, fixed[batch]))
        )
        if batch in warmup:
            lr, examples = warmup[batch]
            arm = Arm(batch, lr, warmup_examples=examples)
            arms.append((ArmResult(arm.label, "warmup", batch, lr), arm))
    lr0 = fixed[task.start_batch]
    for top in settings.ramp_tops:
        arm = Arm(task.start_batch, lr0, ramp_to=top, adam=settings.adam)
        arms.append((ArmResult(arm.label, "ramp", top, lr0), arm))
    for half in settings.halves:
        arm = Arm(
            task.start_batch,
            lr0,
            autopilot=True,
            half=half,
            noise_budget=settings.noise_budget,
            adam=settings.adam,
            switch_on=settings.switch_on,
        )
        arms.append((ArmResult(arm.label, "auto", task.start_batch, lr0, half), arm))
    arms = [(result, arm) for result, arm in arms if result.kind in settings.kinds]
    for seed in settings.eval_seeds:
        for result, arm in arms:
            result.runs.append(reduce_run(run_once(task, arm, seed, settings), settings.targets))
    return [result for result, _ in arms]
