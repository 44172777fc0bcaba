"""The goals of benchmarks/autopilot.py and what it prints (pure: no training here): each
goal's verdict over the tasks, and a task's table at a target."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .outcomes import (
    STALL_FACTOR,
    ArmResult,
    TaskOutcome,
    examples_of,
    median,
    quantile,
    ratio,
    stalls,
    steps_of,
    wall_at,
    wall_of,
)

HALVES = (16, 64, 256, 1024)  # the declared B½ of the simulated columns
GATED_HALVES = (16, 64, 256)  # where "vs best fixed" is a goal
SIM_VS_START = 2.0
WALL_VS_START = 1.5
VS_BEST = 0.8
CLAIM_TOLERANCE = 0.25


@dataclass(frozen=True)
class Verdict:
    """A goal: met (True), not met (False) or not measured (None), and the figures."""

    goal: str
    met: bool | None
    detail: str


def _combine(parts: list[tuple[str, bool | None]]) -> tuple[bool | None, str]:
    met: bool | None = True
    if any(ok is False for _, ok in parts):
        met = False
    elif not parts or any(ok is None for _, ok in parts):
        met = None
    return met, "; ".join(text for text, _ in parts) or "nothing measured"


def _fmt(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.2f}×"


def _gain_since_switch_on(start: ArmResult, auto: ArmResult, target: float) -> float:
    """Switched on late, the gain is the fixed start batch's wall-clock from the examples of
    the switch-on to the target over the autopilot's from its switch-on (median over seeds;
    the runs are the same until the switch-on)."""
    gains = []
    for fixed, run in zip(start.runs, auto.runs, strict=True):
        reached, done = fixed.reaches.get(target), run.reaches.get(target)
        if reached is None or done is None or run.switched is None:
            gains.append(math.nan)
            continue
        examples, wall = run.switched
        gains.append(ratio(reached.wall_s - wall_at(fixed.evals, examples), done.wall_s - wall))
    return median(gains)


def goals(outcomes: Sequence[TaskOutcome]) -> list[Verdict]:
    """The benchmark's goals over every task (see the module's docstring)."""
    robust, sim_start, wall_start, claim, stalled = [], [], [], [], []
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
        if measured is not None and start is not None and measured.runs[0].switched:
            wall_ratio = _gain_since_switch_on(start, measured, target)
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
        stalled.append(_stall_part(task))
    names = [
        ("robust: every target reached, lr finite, batch ≤ 64·B0", robust),
        (f"vs start batch, simulated at B½=64: ≥ {SIM_VS_START:g}×", sim_start),
        (f"vs start batch, wall-clock: ≥ {WALL_VS_START:g}×", wall_start),
        (f"vs best tuned fixed batch, simulated at B½ ≤ 256: ≥ {VS_BEST:g}×", best),
        (f"claimed gain within ±{CLAIM_TOLERANCE:.0%} of the measured wall-clock gain", claim),
        (
            f"stalls (> {STALL_FACTOR:g}× the examples of the fixed batch of the size a run ended "
            "at) no more often than fixed batches'",
            stalled,
        ),
    ]
    return [Verdict(goal, *_combine(parts)) for goal, parts in names]


def _stall_part(task: TaskOutcome) -> tuple[str, bool | None]:
    counted = stalls(task, task.primary)
    (changing, runs), (fixed, fixed_runs) = counted["changing"], counted["fixed"]
    text = f"{task.name}: ramps and autopilot {changing}/{runs}, fixed {fixed}/{fixed_runs}"
    if not runs or not fixed_runs:
        return f"{task.name}: not measured", None
    return text, changing / runs <= fixed / fixed_runs


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
