"""The probe on real models against the real out-of-memory boundary.

For each model (models.py: a ResNet-style CNN and a GPT-style transformer, generated data):

1. A job (``jobs.py probe-job``, a fresh process) trains at its batch size and at twice that
   (two points for its memory model), measures its speed, then probes while it keeps
   training, and reports the probe's result, its speed meanwhile and its memory model.
2. Brute force: the job's own training step at one batch size per fresh process
   (``jobs.py trial``), alone on the GPU, bisecting (probe_accuracy.brute_force) around the
   boundary the probe predicts (from 5% below it to 5% above), to within 0.5%.
3. The what-ifs the probe measured (bf16 autocast, activation checkpointing), searched with
   that technique around their prediction (±10%, to within 3%).
4. The memory model's line, against the peak the trials measured at the largest size that fit.

So that a trial near the boundary takes a fraction of a second, a ballast process holds all
but 16 GiB of the GPU's free memory for the whole check (another process on a shared GPU,
which the probe and the job's budget both see through NVML). The boundaries of both models
are searched before any what-if.
"""

from __future__ import annotations

import functools
import math
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from bsmon.probes.wire.protocol import ProbeResult

from .procs import Children, Deadline, OutOfTime, read_json_line, run_json
from .report import Criterion, Finding, Table

FREE_GIB = 16.0
MODELS = ("resnet", "gpt")
TRIAL_TIMEOUT_S = 90.0
JOB_TIMEOUT_S = 150.0
PREDICTION_GOAL = 0.05
WHAT_IF_GOAL = 0.10
WHAT_IF_TOLERANCE = 0.03
WHAT_IF_RUNS = 6
MEMORY_MODEL_GOAL = 0.10
WHAT_IFS = {"bf16 autocast": {"bf16": True}, "activation checkpointing": {"checkpoint": True}}
GIB = 2**30


@dataclass
class Search:
    """One brute-force search, as probe_accuracy.Search plus the trials' measurements."""

    label: str
    predicted: int | None
    outcome: Any = None  # probe_accuracy.Search
    trials: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    @property
    def seconds(self) -> float:
        return sum(t.get("wall_s", 0.0) for t in self.trials)


@dataclass
class ModelRun:
    name: str
    job: dict[str, Any] | None = None
    result: ProbeResult | None = None
    searches: dict[str, Search] = field(default_factory=dict)
    error: str | None = None


def run(deadline: Deadline) -> Finding:
    runs = {name: ModelRun(name) for name in MODELS}
    notes: list[str] = []
    with Children() as children:
        notes.append(hold_ballast(children))
        for run_ in runs.values():
            probe_and_search(children, run_, deadline)
        for run_ in runs.values():
            search_what_ifs(children, run_, deadline)
    return judge(list(runs.values()), notes)


def hold_ballast(children: Children) -> str:
    ballast = children.python(
        "-m", "gpucheck.jobs", "ballast", "--leave-gib", str(FREE_GIB), stdin=subprocess.PIPE
    )
    held = read_json_line(ballast, timeout=60)
    if not held["held_bytes"]:
        free = held["free_before"] / GIB
        return f"No ballast: the GPU had {free:.1f} GiB free, not more than {FREE_GIB:.0f} GiB."
    return (
        f"A ballast process held {held['held_bytes'] / GIB:.1f} GiB of the "
        f"{held['total'] / GIB:.0f} GiB, leaving {FREE_GIB:.0f} GiB free for the job, the "
        "probe and the trials."
    )


def trial(
    children: Children, run_: ModelRun, search: Search, deadline: Deadline, size: int, **how: bool
) -> bool:
    """The job's step at ``size`` in a fresh process: True when it fits."""
    deadline.require(10, f"{run_.name} trial at {size}")
    args = ["-m", "gpucheck.jobs", "trial", "--model", run_.name, "--batch", str(size)]
    args += [f"--{flag}" for flag, on in how.items() if on]
    started = time.monotonic()
    outcome = run_json(children, args, timeout=min(TRIAL_TIMEOUT_S, deadline.remaining()))
    outcome["wall_s"] = time.monotonic() - started
    search.trials.append(outcome)
    return bool(outcome["fits"])


def probe_and_search(children: Children, run_: ModelRun, deadline: Deadline) -> None:
    from probe_accuracy import raw_prediction

    try:
        deadline.require(60, f"the {run_.name} job and its probe")
        run_.job = run_json(
            children,
            ["-m", "gpucheck.jobs", "probe-job", "--model", run_.name],
            timeout=min(JOB_TIMEOUT_S, deadline.remaining()),
        )
        result = msgspec.convert(run_.job["probe"], ProbeResult)
        run_.result = result
        if result.status != "ok" or not result.predicted_max:
            run_.error = f"probe {result.status}: {result.error or 'no prediction'}"
            return
        search = Search("as is", raw_prediction(result))
        run_.searches["as is"] = search
        fits = functools.partial(trial, children, run_, search, deadline)
        search.outcome = search_around(
            fits, search.predicted, result.max_batch_size, PREDICTION_GOAL, 0.005, max_runs=9
        )
    except (OutOfTime, RuntimeError) as exc:
        run_.error = run_.error or str(exc)
        if "as is" in run_.searches:
            run_.searches["as is"].error = str(exc)


def search_what_ifs(children: Children, run_: ModelRun, deadline: Deadline) -> None:
    result = run_.result
    if result is None or run_.error:
        return
    for what_if in result.what_ifs:
        how = WHAT_IFS.get(what_if.technique)
        if how is None or not what_if.measured or not what_if.max_batch_size:
            continue
        search = Search(what_if.technique, what_if.max_batch_size)
        run_.searches[what_if.technique] = search
        fits = functools.partial(trial, children, run_, search, deadline, **how)
        try:
            search.outcome = search_around(fits, what_if.max_batch_size, result.max_batch_size)
        except (OutOfTime, RuntimeError) as exc:
            search.error = str(exc)


def search_around(
    fits: Callable[[int], bool],
    predicted: int,
    known_fit: int,
    spread: float = WHAT_IF_GOAL,
    tolerance: float = WHAT_IF_TOLERANCE,
    max_runs: int = WHAT_IF_RUNS,
) -> Any:
    """The boundary near a prediction, in few trials: one at ``spread`` below it; when that
    fits, probe_accuracy's search from there up to ``spread`` above it, else from
    ``known_fit`` (a size that ran) up to there."""
    from probe_accuracy import brute_force

    below = max(known_fit, math.floor((1 - spread) * predicted))
    if below > known_fit and not fits(below):
        return brute_force(fits, known_fit, below, tolerance, max_runs, high_fails=True)
    above = math.ceil((1 + spread) * predicted)
    return brute_force(fits, below, above, tolerance, max_runs)


# -- the verdict ---------------------------------------------------------------------------


def _trials_text(search: Search) -> str:
    return ", ".join(f"{t['batch']:,} {'fits' if t['fits'] else 'OOM'}" for t in search.trials)


def _error(predicted: int, boundary: int) -> float:
    return predicted / boundary - 1


def judge(runs: list[ModelRun], notes: list[str]) -> Finding:
    from .models import SPECS

    criteria: list[Criterion] = []
    trial_rows: list[list[str]] = []
    probe_rows: list[list[str]] = []
    figures: dict[str, Any] = {}
    for run_ in runs:
        label = SPECS[run_.name].label
        criteria += model_criteria(run_)
        result, job = run_.result, run_.job or {}
        if result is not None:
            speed = job.get("steps_per_s_during"), job.get("steps_per_s_before")
            probe_rows.append(
                [
                    label,
                    ", ".join(
                        f"{p.batch_size:,}{'' if p.fits else ' (OOM)'}" for p in result.points
                    ),
                    f"{result.predicted_max:,}" if result.predicted_max else "—",
                    f"{result.duration_s:.1f} s",
                    f"{speed[0]:.1f} / {speed[1]:.1f} steps/s" if all(speed) else "n/a",
                    "; ".join(f"{w.technique}: {w.max_batch_size or '—'}" for w in result.what_ifs),
                ]
            )
        for search in run_.searches.values():
            boundary = search.outcome.boundary if search.outcome else None
            trial_rows.append(
                [
                    run_.name,
                    search.label,
                    f"{search.predicted:,}" if search.predicted else "—",
                    f"{boundary:,}" if boundary else "—",
                    _trials_text(search) + (f" — {search.error}" if search.error else ""),
                    f"{len(search.trials)} runs, {search.seconds:.0f} s",
                ]
            )
        figures[run_.name] = {
            "job": job,
            "error": run_.error,
            "searches": {
                k: {
                    "predicted": s.predicted,
                    "boundary": s.outcome.boundary if s.outcome else None,
                    "converged": s.outcome.converged if s.outcome else False,
                    "trials": s.trials,
                    "error": s.error,
                }
                for k, s in run_.searches.items()
            },
        }
    tables = [
        Table(
            [
                "model",
                "probe sizes",
                "predicted (5% margin)",
                "probe took",
                "job during / before",
                "what-ifs (predicted)",
            ],
            probe_rows,
            title="The probe",
        ),
        Table(
            [
                "model",
                "search",
                "predicted",
                "real boundary",
                "trials (each a fresh process)",
                "cost",
            ],
            trial_rows,
            title="Brute force",
        ),
    ]
    failed = [c.what for c in criteria if c.ok is False]
    return Finding(
        summary="predictions within their goals"
        if not failed
        else f"{len(failed)} criteria off: {failed[0]}",
        criteria=criteria,
        tables=tables,
        figures=figures,
        notes=[
            *notes,
            "The job runs with the noise scale off, so the job's step and the trials' step are "
            "the same code (models.train_step); each trial runs 3 steps and counts as fitting "
            "when none raises out of memory.",
        ],
    )


def model_criteria(run_: ModelRun) -> list[Criterion]:
    name, result, job = run_.name, run_.result, run_.job or {}
    if result is None or (run_.error and "as is" not in run_.searches):
        return [
            Criterion(
                f"{name}: the probe ran and predicted",
                run_.error or "no result",
                "a prediction",
                False,
            )
        ]
    out = [
        Criterion(
            f"{name}: sizes the probe ran", str(len(result.points)), "≤ 3", len(result.points) <= 3
        ),
    ]
    base = run_.searches.get("as is")
    if base is None:
        out.append(
            Criterion(f"{name}: the real boundary", run_.error or "not searched", "found", False)
        )
        return out
    out.append(
        prediction_criterion(
            f"{name}: predicted largest batch vs the real boundary",
            base,
            PREDICTION_GOAL,
            result.predicted_max,
        )
    )
    for technique in WHAT_IFS:
        search = run_.searches.get(technique)
        if search is None:
            what_if = next((w for w in result.what_ifs if w.technique == technique), None)
            why = what_if.note if what_if is not None else "not offered"
            out.append(
                Criterion(f"{name}: {technique} what-if", f"not measured ({why})", "measured", None)
            )
        else:
            what = f"{name}: {technique} what-if vs its real boundary"
            out.append(prediction_criterion(what, search, WHAT_IF_GOAL))
    out.append(memory_model_criterion(name, job, base))
    during, before = job.get("steps_per_s_during"), job.get("steps_per_s_before")
    out.append(
        Criterion(
            f"{name}: the job's speed while the probe ran",
            f"{during / before:.2f}× ({before:.1f} → {during:.1f} steps/s)"
            if during and before
            else "n/a",
            "keeps training (the sidecar shares the device)",
            bool(during) and job.get("errors") == 0,
        )
    )
    return out


def prediction_criterion(
    what: str, search: Search, goal: float, with_margin: int | None = None
) -> Criterion:
    """A predicted largest batch against the boundary its search found."""
    goal_text = f"within ±{goal:.0%}" + ("; with the margin, ≤ it" if with_margin else "")
    outcome, predicted = search.outcome, search.predicted or 0
    if outcome is None or not outcome.converged:
        found = search.error or "no boundary found"
        if outcome is not None:
            found = (
                f"the boundary is between {outcome.boundary:,} and {outcome.failed or '?'} "
                f"after {len(search.trials)} runs"
            )
        return Criterion(what, f"{predicted:,}; {found}", goal_text, False)
    error = _error(predicted, outcome.boundary)
    measured = f"{predicted:,} vs {outcome.boundary:,} ({error:+.1%})"
    ok = abs(error) <= goal
    if with_margin is not None:
        measured += f"; with the margin {with_margin:,}"
        ok = ok and with_margin <= outcome.boundary
    return Criterion(what, measured, goal_text, ok)


def memory_model_criterion(name: str, job: dict[str, Any], base: Search) -> Criterion:
    """The job's memory model (its line through its own peaks) at the largest size a trial
    ran, against that trial's measured peak."""
    what = f"{name}: the job's memory model at the largest size that fit"
    fit = job.get("memory_fit")
    fitting = [t for t in base.trials if t["fits"]]
    if not fit or not fitting:
        points = job.get("memory_points")
        return Criterion(what, f"no line (points: {points})", "a line through ≥ 2 sizes", False)
    largest = max(fitting, key=lambda t: t["batch"])
    predicted = fit[0] + fit[1] * largest["batch"]
    error = predicted / largest["peak_allocated"] - 1
    return Criterion(
        what,
        f"peak at {largest['batch']:,}: {predicted / GIB:.2f} GiB predicted, "
        f"{largest['peak_allocated'] / GIB:.2f} GiB measured ({error:+.1%})",
        f"within ±{MEMORY_MODEL_GOAL:.0%}",
        abs(error) <= MEMORY_MODEL_GOAL,
    )
