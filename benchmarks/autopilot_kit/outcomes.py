"""What benchmarks/autopilot.py reads from its runs (pure: tests/unit/test_autopilot_benchmark.py):
where a run reached each target, its simulated time, the step-time fit, and an arm's and a
task's runs over the evaluation seeds."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

Evaluation = tuple[int, int, float, float]  # (examples, steps, training wall-clock s, loss)


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


def wall_at(evals: Sequence[Evaluation], examples: float) -> float:
    """The training wall-clock at which a run had seen ``examples``: linear between the
    evaluations around it (the last one's, past it)."""
    for (before, _, before_wall, _), (after, _, after_wall, _) in itertools.pairwise(evals):
        if before <= examples <= after:
            share = (examples - before) / (after - before) if after > before else 1.0
            return before_wall + share * (after_wall - before_wall)
    return evals[-1][2] if evals else 0.0


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
    evals: tuple[Evaluation, ...] = ()
    switched: tuple[int, float] | None = None  # examples and wall-clock s at a late switch-on


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


def ratio(base: float, run: float) -> float:
    """``base / run`` (> 1: the run is faster); inf/inf and NaN give NaN."""
    if math.isnan(base) or math.isnan(run) or (math.isinf(base) and math.isinf(run)):
        return math.nan
    if run == 0:
        return math.inf
    return base / run


def reduce_run(log: Any, targets: Sequence[float]) -> Run:
    """A ``RunLog`` (``training``) as the goals read it."""
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
        evals=tuple(log.evals),
        switched=log.switched,
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


STALL_FACTOR = 1.5  # a run needing this many times the examples of its size's fixed batch


def stalls(task: TaskOutcome, target: float) -> dict[str, tuple[int, int]]:
    """Runs that stalled, of all: ``fixed`` (a fixed batch's run needing more than
    ``STALL_FACTOR``× its arm's median examples to ``target``, or never reaching it) and
    ``changing`` (a ramp's or the autopilot's run needing more than that times the median of
    the fixed batch of the size it ended at, interpolated on a log scale between the fixed
    sizes). A batch that grew well needs fewer examples than fixed at its end size, since it
    spent its first examples at smaller sizes; one that sat on a plateau needs more."""
    fixed = {arm.batch: arm.median(target, examples_of) for arm in task.arms if arm.kind == "fixed"}
    counts = {"fixed": [0, 0], "changing": [0, 0]}
    for arm in task.arms:
        if arm.kind not in ("fixed", "ramp", "auto"):
            continue
        group = "fixed" if arm.kind == "fixed" else "changing"
        for run, used in zip(arm.runs, arm.metric(target, examples_of), strict=True):
            size = arm.batch if arm.kind != "auto" else run.final_size or run.max_size
            reference = fixed[arm.batch] if arm.kind == "fixed" else reference_examples(fixed, size)
            counts[group][0] += not used <= STALL_FACTOR * reference
            counts[group][1] += 1
    return {group: (stalled, runs) for group, (stalled, runs) in counts.items()}


def reference_examples(fixed: Mapping[int, float], size: int) -> float:
    """The fixed batches' median examples at ``size``: linear in log₂(size) between the two
    fixed sizes around it, the nearest one's beyond them."""
    sizes = sorted(fixed)
    if size <= sizes[0] or size >= sizes[-1]:
        return fixed[sizes[0] if size <= sizes[0] else sizes[-1]]
    above = next(s for s in sizes if s >= size)
    below = max(s for s in sizes if s <= size)
    if above == below:
        return fixed[size]
    share = math.log2(size / below) / math.log2(above / below)
    return fixed[below] + share * (fixed[above] - fixed[below])
