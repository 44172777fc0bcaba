"""The autopilot against fixed batches: time to a target loss on two small CPU tasks.

The protocol of research/autopilot.md §7, on the tasks of ``autopilot_tasks`` (T1: synthetic
10-class classification with an MLP; T2: a character-level model of the Python standard
library's own sources; no download, SGD with momentum 0.9, one thread):

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
   pace, 2× per decision) up to 8·B0 … 64·B0 and held there, B0's rate moved linearly with
   it. A ramp to S is the best any autopilot with these guards could do had it known from
   the start that S is the size to steer to; B_simple's model picks S = the doubling where
   the goodput gain stops paying (docs/benchmarks.md reads it with the exact B_simple).

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

    python benchmarks/autopilot.py                                  # both tasks, 5 seeds (~32 min)
    python benchmarks/autopilot.py --quick                          # a smoke run (~3 min)
    python benchmarks/autopilot.py --write-lr-table /tmp/lr.json    # keep the tuning ...
    python benchmarks/autopilot.py --lr-table /tmp/lr.json          # ... and skip it next time
    python benchmarks/autopilot.py --tasks charlm --seeds 3
    python benchmarks/autopilot.py --cost                           # goal C5 alone (~2 min)
    python benchmarks/autopilot.py --lag                            # the noise scale's lag

Progress goes to stderr, the tables and verdicts to stdout. Figures are printed, never
asserted (docs/benchmarks.md keeps them).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

HALVES = (16, 64, 256, 1024)  # the declared B½ of the simulated columns
GATED_HALVES = (16, 64, 256)  # where "vs best fixed" is a goal
SIM_VS_START = 2.0
WALL_VS_START = 1.5
VS_BEST = 0.8
CLAIM_TOLERANCE = 0.25
COST_GOAL = 0.03  # the autopilot's estimate and decisions, of the step time
TUNING_SEEDS = (0, 1)
FIRST_EVAL_SEED = 10
LR_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)
WARMUP_FACTORS = (1.0, 2.0, 4.0)
EXTENSIONS = 2  # grid steps added past a winning edge, at most
MAX_RUN_S = 120.0  # a run's training wall-clock cap

Evaluation = tuple[int, int, float, float]  # (examples, steps, training wall-clock s, loss)


# -- pure pieces (tests/unit/test_autopilot_benchmark.py) -------------------------------------


class Reach(NamedTuple):
    """Where a run reached a target loss (interpolated between two evaluations)."""

    examples: float
    steps: float
    wall_s: float


def time_to_target(evals: Sequence[Evaluation], target: float) -> Reach | None:
    """Examples, steps and wall-clock at which the loss first reached ``target``: linear
    between the last evaluation above it and the first at or below it (None: never)."""
    for index, (examples, steps, wall, loss) in enumerate(evals):
        if not loss <= target:  # NaN never reaches
            continue
        if index == 0:
            return Reach(float(examples), float(steps), wall)
        before_examples, before_steps, before_wall, before_loss = evals[index - 1]
        share = (before_loss - target) / (before_loss - loss) if before_loss > loss else 1.0
        return Reach(
            before_examples + share * (examples - before_examples),
            before_steps + share * (steps - before_steps),
            before_wall + share * (wall - before_wall),
        )
    return None


def simulated_time(reach: Reach | None, half: float) -> float:
    """Σ_k (B½ + B_k) over the steps to the target: the time under t(B) = c·(B½ + B), in units
    of c, which is B½·steps + examples (infinite when the target was never reached)."""
    if reach is None:
        return math.inf
    return half * reach.steps + reach.examples


def fit_step_time(times: Mapping[int, float]) -> tuple[float, float]:
    """t(B) = t0 + c·B through measured step times, least squares on the relative error (each
    point weighted by 1/t², so the small batches count as much as the large); (t0, c)."""
    weights = {b: 1 / t**2 for b, t in times.items()}
    total = sum(weights.values())
    mean_b = sum(w * b for b, w in weights.items()) / total
    mean_t = sum(w * times[b] for b, w in weights.items()) / total
    spread = sum(w * (b - mean_b) ** 2 for b, w in weights.items())
    c = sum(w * (b - mean_b) * (times[b] - mean_t) for b, w in weights.items()) / spread
    return mean_t - c * mean_b, c


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile, linear between order statistics (inf stays inf)."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    share = position - low
    if share == 0 or ordered[low] == ordered[high]:
        return ordered[low]
    return ordered[low] + share * (ordered[high] - ordered[low])


def median(values: Sequence[float]) -> float:
    return quantile(values, 0.5) if values else math.nan


@dataclass(frozen=True)
class Run:
    """One run, reduced: where it reached each target, and what the checks need."""

    reaches: dict[float, Reach | None]
    max_size: int
    bad_lr: bool  # a NaN or infinite learning rate on some step
    claimed_gain: float | None = None  # the autopilot's claim vs B0 (the latest it made)
    claimed_at_end: bool = True  # False: none at the end, the latest one seen is used
    final_size: int | None = None
    decisions: int = 0
    state: str | None = None
    why: str | None = None
    trajectory: str = ""  # the decisions, one by one


@dataclass
class ArmResult:
    """One arm over the evaluation seeds. ``kind``: ``fixed``, ``warmup``, ``auto`` or
    ``ramp`` (the fastest ramp to ``batch``, a bound: never a "best fixed" baseline); for
    the autopilot ``half`` is the declared B½ (None: fitted from its own step times)."""

    label: str
    kind: str
    batch: int
    lr: float
    half: float | None = None
    runs: list[Run] = field(default_factory=list)

    def reaches(self, target: float) -> list[Reach | None]:
        return [run.reaches.get(target) for run in self.runs]

    def reached(self, target: float) -> int:
        return sum(reach is not None for reach in self.reaches(target))

    def metric(self, target: float, read: Callable[[Reach], float]) -> list[float]:
        return [math.inf if r is None else read(r) for r in self.reaches(target)]

    def median(self, target: float, read: Callable[[Reach], float]) -> float:
        return median(self.metric(target, read))

    def simulated(self, target: float, half: float) -> float:
        return median([simulated_time(r, half) for r in self.reaches(target)])


def steps_of(reach: Reach) -> float:
    return reach.steps


def examples_of(reach: Reach) -> float:
    return reach.examples


def wall_of(reach: Reach) -> float:
    return reach.wall_s


@dataclass
class TaskOutcome:
    """A task's arms over the evaluation seeds; ``targets`` loosest first (the last is the
    one the goals are judged at)."""

    name: str
    start_batch: int
    ceiling: int
    targets: tuple[float, ...]
    arms: list[ArmResult]
    cpu_half: float | None = None

    @property
    def primary(self) -> float:
        return self.targets[-1]

    def fixed(self) -> list[ArmResult]:
        return [arm for arm in self.arms if arm.kind in ("fixed", "warmup")]

    def start(self) -> ArmResult | None:
        return next(
            (a for a in self.arms if a.kind == "fixed" and a.batch == self.start_batch), None
        )

    def auto(self, half: float | None) -> ArmResult | None:
        return next((a for a in self.arms if a.kind == "auto" and a.half == half), None)

    def best_simulated(self, target: float, half: float) -> float:
        """The lowest median simulated time of the fixed arms (warm-up baselines included)."""
        return min((arm.simulated(target, half) for arm in self.fixed()), default=math.inf)


@dataclass(frozen=True)
class Verdict:
    """A goal: met (True), not met (False) or not measured (None), and the figures."""

    goal: str
    met: bool | None
    detail: str


def ratio(base: float, run: float) -> float:
    """``base / run`` (> 1: the run is faster); inf/inf and NaN give NaN."""
    if math.isnan(base) or math.isnan(run) or (math.isinf(base) and math.isinf(run)):
        return math.nan
    if run == 0:
        return math.inf
    return base / run


def _combine(parts: list[tuple[str, bool | None]]) -> tuple[bool | None, str]:
    met: bool | None = True
    if any(ok is False for _, ok in parts):
        met = False
    elif not parts or any(ok is None for _, ok in parts):
        met = None
    return met, "; ".join(text for text, _ in parts) or "nothing measured"


def _fmt(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.2f}×"


def goals(outcomes: Sequence[TaskOutcome]) -> list[Verdict]:
    """The benchmark's goals over every task (see the module's docstring)."""
    robust, sim_start, wall_start, claim = [], [], [], []
    best: list[tuple[str, bool | None]] = []
    for task in outcomes:
        name, target = task.name, task.primary
        autos = [a for a in task.arms if a.kind == "auto"]
        runs = [run for arm in autos for run in arm.runs]
        if runs:
            reached = sum(all(run.reaches.get(t) for t in task.targets) for run in runs)
            bad = sum(run.bad_lr for run in runs)
            top = max(run.max_size for run in runs)
            ok = reached == len(runs) and not bad and top <= task.ceiling
            text = (
                f"{name}: {reached}/{len(runs)} runs reached every target, {bad} with a "
                f"NaN/∞ lr, largest batch {top} (ceiling {task.ceiling})"
            )
            robust.append((text, ok))
        else:
            robust.append((f"{name}: no autopilot run", None))
        start, at64, measured = task.start(), task.auto(64), task.auto(None)
        if start is not None and at64 is not None:
            value = ratio(start.simulated(target, 64), at64.simulated(target, 64))
            ok = None if math.isnan(value) else value >= SIM_VS_START
            sim_start.append((f"{name} {_fmt(value)}", ok))
        else:
            sim_start.append((f"{name}: not measured", None))
        wall_ratio = math.nan
        if start is not None and measured is not None:
            wall_ratio = ratio(start.median(target, wall_of), measured.median(target, wall_of))
            ok = None if math.isnan(wall_ratio) else wall_ratio >= WALL_VS_START
            wall_start.append((f"{name} {_fmt(wall_ratio)}", ok))
        else:
            wall_start.append((f"{name}: not measured", None))
        for half in HALVES:
            arm = task.auto(half)
            if arm is None:
                if half in GATED_HALVES:
                    best.append((f"{name} B½={half}: not measured", None))
                continue
            value = ratio(task.best_simulated(target, half), arm.simulated(target, half))
            gated = half in GATED_HALVES
            ok = (None if math.isnan(value) else value >= VS_BEST) if gated else True
            best.append((f"{name} B½={half} {_fmt(value)}{'' if gated else ' (not gated)'}", ok))
        claims = [r.claimed_gain for r in measured.runs] if measured is not None else []
        known = [c for c in claims if c is not None]
        if measured is None or math.isnan(wall_ratio):
            claim.append((f"{name}: not measured", None))
        elif len(known) < len(claims) or not known:
            claim.append(
                (f"{name}: {len(claims) - len(known)}/{len(claims)} runs claimed none", False)
            )
        else:
            claimed = median(known)
            off = claimed / wall_ratio - 1 if wall_ratio and math.isfinite(wall_ratio) else math.inf
            text = f"{name} claimed {claimed:.2f}× vs measured {_fmt(wall_ratio)} ({off:+.0%})"
            claim.append((text, abs(off) <= CLAIM_TOLERANCE))
    names = [
        ("robust: every target reached, lr finite, batch ≤ 64·B0", robust),
        (f"vs start batch, simulated at B½=64: ≥ {SIM_VS_START:g}×", sim_start),
        (f"vs start batch, wall-clock: ≥ {WALL_VS_START:g}×", wall_start),
        (f"vs best tuned fixed batch, simulated at B½ ≤ 256: ≥ {VS_BEST:g}×", best),
        (f"claimed gain within ±{CLAIM_TOLERANCE:.0%} of the measured wall-clock gain", claim),
    ]
    return [Verdict(goal, *_combine(parts)) for goal, parts in names]


def reduce_run(log: Any, targets: Sequence[float]) -> Run:
    """A ``RunLog`` (autopilot_tasks) as the goals read it."""
    sizes = list(log.sizes) + list(log.monitor_sizes)
    return Run(
        reaches={t: time_to_target(log.evals, t) for t in targets},
        max_size=max(sizes, default=0),
        bad_lr=any(not math.isfinite(lr) for lr in log.lrs),
        claimed_gain=log.claimed_seen,
        claimed_at_end=log.claimed_gain is not None,
        final_size=log.monitor_sizes[-1] if log.monitor_sizes else None,
        decisions=len(log.decisions),
        state=log.state,
        why=log.why,
        trajectory=trajectory(log.decisions, log.lrs),
    )


def trajectory(decisions: Sequence[Mapping[str, Any]], lrs: Sequence[float]) -> str:
    """The autopilot's decisions in one line: old→new at a step, with the noise scale and B½
    it decided on and the learning rate the step after it ran with."""
    parts = []
    for d in decisions:
        step, phi, half = d.get("step", 0), d.get("b_simple"), d.get("half_batch")
        lr = f", lr {lrs[step]:.3g}" if 0 <= step < len(lrs) else ""
        phi_text = f"φ {phi:.0f}" if phi is not None else "φ ?"
        half_text = f"B½ {half:.0f}" if half is not None else "B½ ∞"
        parts.append(f"{d.get('old')}→{d.get('new')} @{step} ({phi_text}, {half_text}{lr})")
    return "; ".join(parts) or "no decision"


# -- printing -------------------------------------------------------------------------------


def _count(value: float) -> str:
    if math.isinf(value):
        return "—"
    return f"{value / 1000:.0f}k" if value >= 10_000 else f"{value:.0f}"


def table(task: TaskOutcome, target: float) -> list[str]:
    """The task's rows at ``target``: medians over the seeds, ratios against the best fixed."""
    halves: list[tuple[str, float]] = [(f"B½={h}", float(h)) for h in HALVES]
    if task.cpu_half is not None:
        halves.append(("CPU", task.cpu_half))
    seeds = max((len(a.runs) for a in task.arms), default=0)
    lines = [
        f"{task.name}: held-out loss ≤ {target:g} ({seeds} seed{'s' if seeds != 1 else ''}, "
        "medians; sim = best fixed's "
        "simulated time over the run's, > 1 faster)",
        f"  {'run':<30} {'lr':>7} {'reached':>7} {'steps':>7} {'examples':>8} "
        f"{'wall s [IQR]':>20}  "
        + " ".join(f"{name:>7}" for name, _ in halves)
        + "  auto: claim, end batch, decisions",
    ]
    best = {name: task.best_simulated(target, half) for name, half in halves}
    for arm in task.arms:
        walls = arm.metric(target, wall_of)
        iqr = f"[{quantile(walls, 0.25):.2f}–{quantile(walls, 0.75):.2f}]" if walls else ""
        wall = median(walls)
        cells = []
        for name, half in halves:
            value = ratio(best[name], arm.simulated(target, half))
            mark = "*" if arm.kind == "auto" and arm.half == half else " "
            cells.append(f"{_fmt(value)}{mark}".rjust(7))
        extra = ""
        if arm.kind == "auto":
            claims = [r.claimed_gain for r in arm.runs if r.claimed_gain is not None]
            ends = [r.final_size for r in arm.runs if r.final_size is not None]
            claim = f"{median(claims):.2f}×" if claims else "none"
            end = f"{median(ends):.0f}" if ends else "?"
            states = sorted({r.state or "?" for r in arm.runs})
            extra = (
                f"  {claim}, {end}, {median([r.decisions for r in arm.runs]):.0f}"
                f" ({'/'.join(states)})"
            )
        wall_text = "—" if math.isinf(wall) else f"{wall:.2f} {iqr}"
        steps, examples = arm.median(target, steps_of), arm.median(target, examples_of)
        lines.append(
            f"  {arm.label:<30} {arm.lr:>7.3g} {arm.reached(target)}/{len(arm.runs):<5} "
            f"{_count(steps):>7} {_count(examples):>8} "
            f"{wall_text:>20}  " + " ".join(cells) + extra
        )
    walls = {a.label: a.median(target, wall_of) for a in task.fixed()}
    if walls:
        fastest = min(walls, key=lambda k: walls[k])
        lines.append(f"  best fixed wall-clock: {fastest} ({walls[fastest]:.2f} s)")
    lines.append("  * the autopilot's own column (the B½ it was told)")
    for arm in task.arms:
        if arm.kind == "auto" and arm.runs:
            lines.append(f"  {arm.label}, first seed: {arm.runs[0].trajectory}")
    return lines


def verdict_lines(verdicts: Sequence[Verdict]) -> list[str]:
    words = {True: "met", False: "NOT MET", None: "not measured"}
    return [f"  [{words[v.met]:>12}] {v.goal}: {v.detail}" for v in verdicts]


# -- running (needs torch and bsmon) ---------------------------------------------------------


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


def run_once(task: Any, arm: Any, seed: int, settings: Settings) -> Any:
    from autopilot_tasks import train

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
    from autopilot_tasks import Arm

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
    from autopilot_tasks import step_times

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
    from autopilot_tasks import Arm

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
        arm = Arm(task.start_batch, lr0, ramp_to=top)
        arms.append((ArmResult(arm.label, "ramp", top, lr0), arm))
    for half in settings.halves:
        arm = Arm(
            task.start_batch, lr0, autopilot=True, half=half, noise_budget=settings.noise_budget
        )
        arms.append((ArmResult(arm.label, "auto", task.start_batch, lr0, half), arm))
    for seed in settings.eval_seeds:
        for result, arm in arms:
            result.runs.append(reduce_run(run_once(task, arm, seed, settings), settings.targets))
    return [result for result, _ in arms]


def cost(names: Sequence[str]) -> int:
    """Goal C5: the autopilot's estimate and decisions together ≤ 3% of the step time."""
    from autopilot_tasks import COST_CONFIGS, TASKS, autopilot_cost

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
    from autopilot_tasks import TASKS, noise_lag

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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["synthetic", "charlm"])
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
    args = parser.parse_args(argv)
    if args.noise_budget is not None and not 0 < args.noise_budget <= 1:
        parser.error(f"--noise-budget must be a share in (0, 1], got {args.noise_budget:g}")

    import torch
    from autopilot_tasks import TASKS

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
