"""The probe on real models against the real out-of-memory boundary.

For each model (models.py: a ResNet-style CNN and a GPT-style transformer, generated data):

1. A job (``jobs.py probe-job``, a fresh process) trains at its batch size and at twice that
   (two points for its memory model), measures its speed, then probes while it keeps
   training, and reports the probe's result, its speed meanwhile and its memory model.
2. Brute force: the job's own training step at one batch size per fresh process
   (``jobs.py trial``), alone on the GPU. The search (boundary.py) starts from the probe's own
   bounds — the largest size it ran or confirmed, the smallest it saw fail — tries the
   prediction (before its margin) first, then a rung 2% and one 5% away from it, then bisects
   to within 1%.
3. The recommendation (and the prediction with its margin): each settled by the trials, or
   by one more trial at it when the search left it inside its last bracket.
4. The what-ifs the probe measured (bf16 autocast, activation checkpointing), searched the
   same way with that technique from their own predictions (rungs 6% and 10% away, to within
   3%), one technique for both models, then the other.
5. The memory model's line, against the peak the trials measured at the largest size that fit.

So that a trial near the boundary takes a fraction of a second, a ballast process holds all
but 16 GiB of the GPU's free memory for the whole check (another process on a shared GPU,
which the probe and the job's budget both see through NVML).

The budget (checks.py: 420 s). On the H100 (docs/gpu-report.md, 2026-11-24) a trial took
9–11 s, CUDA start-up included (ResNet 76 s for 7, GPT 54 s for 6), and the ballast with
both jobs and their probes 68 s. So, at 10 s a trial:

- the ballast and the two jobs with their probes: 80 s (68 s, and the probe's confirmation);
- two boundary searches of at most 6 trials: 12 × 10 = 120 s. From batch 100 up, a
  prediction within 5% of its boundary converges to 1% in at most 5 (the prediction, the 2%
  rung, the 5% rung, two halvings of the 3% between them); the sixth settles an end that was
  the probe's claim, or narrows the bracket of a prediction that missed;
- the recommendations: at most one trial each, 20 s (only when the search left one inside
  its last bracket);
- four what-if searches of at most 4 trials: 16 × 10 = 160 s (within 10% of the prediction,
  converged to 3% in 4; every verdict, within 10% or not, is decided by the third).

That is 380 s; with the runner's 5 s grace and 35 s for slower trials, 420 s. A search that
runs out of trials or time is judged on its bracket: a verdict holds when every boundary the
bracket allows gives it.
"""

from __future__ import annotations

import functools
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from bsmon.probes.wire.protocol import ProbeResult

from .boundary import Boundary, search_boundary
from .procs import Children, Deadline, OutOfTime, read_json_line, run_json
from .report import Criterion, Finding, Table

FREE_GIB = 16.0
MODELS = ("resnet", "gpt")
TRIAL_S = 10.0  # a trial's wall time on the H100, CUDA start-up included (9–11 s measured)
TRIAL_TIMEOUT_S = 90.0
JOB_TIMEOUT_S = 150.0
PREDICTION_GOAL = 0.05
PREDICTION_TOLERANCE = 0.01
PREDICTION_RUNS = 6
WHAT_IF_GOAL = 0.10
WHAT_IF_TOLERANCE = 0.03
WHAT_IF_RUNS = 4
MEMORY_MODEL_GOAL = 0.10
WHAT_IFS = {"bf16 autocast": {"bf16": True}, "activation checkpointing": {"checkpoint": True}}
GIB = 2**30


@dataclass
class Search:
    """One brute-force search: what it knows of the boundary (its trials as (size, fits))
    and each trial's measurements."""

    label: str
    bounds: Boundary
    trials: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    @property
    def predicted(self) -> int:
        return self.bounds.predicted

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
        for technique in WHAT_IFS:  # one technique for both models, then the other
            for run_ in runs.values():
                search_what_if(children, run_, technique, deadline)
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
    deadline.require(TRIAL_S, f"{run_.name} trial at {size}")
    args = ["-m", "gpucheck.jobs", "trial", "--model", run_.name, "--batch", str(size)]
    args += [f"--{flag}" for flag, on in how.items() if on]
    started = time.monotonic()
    outcome = run_json(children, args, timeout=min(TRIAL_TIMEOUT_S, deadline.remaining()))
    outcome["wall_s"] = time.monotonic() - started
    search.trials.append(outcome)
    return bool(outcome["fits"])


def probe_bounds(result: ProbeResult) -> tuple[int, int | None]:
    """The probe's own bounds on the boundary: the largest size it ran (its confirmation
    step included, where the result has one) and the smallest it saw fail (None: none)."""
    confirmed = result.confirmed_max or 0
    failed = [p.batch_size for p in result.points if not p.fits]
    return max(result.max_batch_size, confirmed), min(failed, default=None)


def as_is_search(result: ProbeResult) -> Search:
    from probe_accuracy import raw_prediction

    fit, fail = probe_bounds(result)
    bounds = Boundary(
        raw_prediction(result),
        PREDICTION_GOAL,
        PREDICTION_TOLERANCE,
        claimed_fit=fit,
        claimed_fail=fail,
    )
    return Search("as is", bounds)


def probe_and_search(children: Children, run_: ModelRun, deadline: Deadline) -> None:
    """The job and its probe, the boundary's search, then the recommendation's trial."""
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
        base = run_.searches["as is"] = as_is_search(result)
        fits = functools.partial(trial, children, run_, base, deadline)
        search_boundary(fits, base.bounds, PREDICTION_RUNS)
        for size in offered_sizes(result):
            base.bounds.settle(fits, size)
    except (OutOfTime, RuntimeError) as exc:
        run_.error = run_.error or str(exc)
        if "as is" in run_.searches:
            run_.searches["as is"].error = str(exc)


def offered_sizes(result: ProbeResult) -> list[int]:
    """The sizes the probe offers as safe: its recommendation and its prediction with the
    margin."""
    sizes = [result.recommendation.batch_size] if result.recommendation is not None else []
    if result.predicted_max:
        sizes.append(result.predicted_max)
    return sizes


def search_what_if(children: Children, run_: ModelRun, technique: str, deadline: Deadline) -> None:
    """The real boundary with ``technique``, from the what-if's own prediction and the
    largest size the probe ran (it measured the technique there)."""
    result = run_.result
    if result is None or run_.error:
        return
    what_if = next((w for w in result.what_ifs if w.technique == technique), None)
    if what_if is None or not what_if.measured or not what_if.max_batch_size:
        return
    bounds = Boundary(
        what_if.max_batch_size,
        WHAT_IF_GOAL,
        WHAT_IF_TOLERANCE,
        claimed_fit=result.max_batch_size,
    )
    found = run_.searches[technique] = Search(technique, bounds)
    fits = functools.partial(trial, children, run_, found, deadline, **WHAT_IFS[technique])
    try:
        search_boundary(fits, bounds, WHAT_IF_RUNS)
    except (OutOfTime, RuntimeError) as exc:
        found.error = str(exc)


# -- the verdict ---------------------------------------------------------------------------


def _trials_text(search: Search) -> str:
    fit, fail = search.bounds.claimed_fit, search.bounds.claimed_fail
    start = f"probe: {fit:,} ran" + (f", {fail:,} OOM" if fail else "")
    trials = ", ".join(f"{t['batch']:,} {'fits' if t['fits'] else 'OOM'}" for t in search.trials)
    return f"({start}) {trials}"


def boundary_text(bounds: Boundary) -> str:
    """The real boundary: the largest size that ran when the bracket is within its
    tolerance, else the sizes it may be."""
    if not bounds.consistent:
        return "the trials disagree"
    if bounds.converged:
        return f"{bounds.low:,}"
    high = bounds.high
    return f"≥ {bounds.low:,}" if high is None else f"{bounds.low:,}–{high - 1:,}"


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
            probe_rows.append(probe_row(label, result, job))
        for search in run_.searches.values():
            trial_rows.append(
                [
                    run_.name,
                    search.label,
                    f"{search.predicted:,}",
                    boundary_text(search.bounds),
                    _trials_text(search) + (f" — {search.error}" if search.error else ""),
                    f"{len(search.trials)} runs, {search.seconds:.0f} s",
                ]
            )
        figures[run_.name] = {
            "job": job,
            "error": run_.error,
            "recommendation": result.recommendation.batch_size
            if result is not None and result.recommendation is not None
            else None,
            "confirmed_max": result.confirmed_max,
            "searches": {k: search_figures(s) for k, s in run_.searches.items()},
        }
    tables = [
        Table(
            [
                "model",
                "probe sizes",
                "predicted (5% margin)",
                "recommended",
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
        summary="predictions within their goals, the recommendations within the boundaries"
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
            "Each search starts from the probe's own bounds (in brackets: the largest size it "
            "ran or confirmed, the smallest it saw fail). They are the probe's claims: a bracket "
            "that ends on one is settled by a trial at it, and a trial that contradicts one "
            "wins. A size the probe offers fits when a trial at it or above it ran.",
        ],
    )


def probe_row(label: str, result: ProbeResult, job: dict[str, Any]) -> list[str]:
    speed = job.get("steps_per_s_during"), job.get("steps_per_s_before")
    recommended = "—"
    if result.recommendation is not None:
        recommended = f"{result.recommendation.batch_size:,}"
        confirmed = result.confirmed_max
        recommended += f" (ran {confirmed:,})" if confirmed else " (not run)"
    return [
        label,
        ", ".join(f"{p.batch_size:,}{'' if p.fits else ' (OOM)'}" for p in result.points),
        f"{result.predicted_max:,}" if result.predicted_max else "—",
        recommended,
        f"{result.duration_s:.1f} s",
        f"{speed[0]:.1f} / {speed[1]:.1f} steps/s" if all(speed) else "n/a",
        "; ".join(f"{w.technique}: {w.max_batch_size or '—'}" for w in result.what_ifs),
    ]


def search_figures(search: Search) -> dict[str, Any]:
    bounds = search.bounds
    return {
        "predicted": bounds.predicted,
        "probe_fit": bounds.claimed_fit,
        "probe_fail": bounds.claimed_fail,
        "boundary": bounds.low,
        "failed": bounds.high,
        "converged": bounds.converged,
        "trials": search.trials,
        "error": search.error,
    }


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
    out = [sizes_criterion(name, result)]
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
    out.append(recommendation_criterion(name, result, base))
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


def sizes_criterion(name: str, result: ProbeResult) -> Criterion:
    """At most three sizes searched, plus the step that confirms the recommendation (the
    last point, at the confirmed size, where the result reports one)."""
    sizes = [p.batch_size for p in result.points]
    confirmed = result.confirmed_max
    confirming = confirmed is not None and len(sizes) > 3 and sizes[-1] == confirmed
    searched = len(sizes) - confirming
    measured = f"{searched}" + (f" + a confirmation at {confirmed:,}" if confirming else "")
    return Criterion(
        f"{name}: sizes the probe ran", measured, "≤ 3 (+ a confirmation)", searched <= 3
    )


def prediction_criterion(
    what: str, search: Search, goal: float, with_margin: int | None = None
) -> Criterion:
    """A predicted largest batch against the boundary its search found: its error when the
    search converged, else every error its bracket allows (the verdict when they all agree)."""
    goal_text = f"within ±{goal:.0%}" + ("; with the margin, ≤ it" if with_margin else "")
    bounds, predicted = search.bounds, search.predicted
    if not bounds.consistent:
        return Criterion(what, f"{predicted:,}; the trials disagree", goal_text, False)
    if bounds.converged and not bounds.low:
        return Criterion(what, f"{predicted:,}; nothing fits", goal_text, False)
    if bounds.converged:
        error = predicted / bounds.low - 1
        measured = f"{predicted:,} vs {bounds.low:,} ({error:+.1%})"
        ok = abs(error) <= goal
    else:
        least, most = bounds.error_range(predicted)
        ok = -goal <= least and most <= goal
        low, high = bounds.low, bounds.high
        where = f"at least {low:,}" if high is None else f"between {low:,} and {high:,}"
        measured = f"{predicted:,}; the boundary is {where} after {len(bounds.trials)} runs"
        if ok or least > goal or most < -goal:  # every boundary it allows says the same
            errors = f"≤ {most:+.1%}" if high is None else f"{least:+.1%} to {most:+.1%}"
            measured += f" (error {errors})"
        else:
            measured += f"; undecided ({search.error or 'out of runs'})"
    if with_margin is not None:
        margin_fits = bounds.fits(with_margin)
        measured += f"; with the margin {with_margin:,}" + _fits_text(margin_fits)
        ok = ok and margin_fits is True
    return Criterion(what, measured, goal_text, ok)


def _fits_text(fits: bool | None) -> str:
    return {True: " ran", False: " ran out of memory", None: " not settled"}[fits]


def recommendation_criterion(name: str, result: ProbeResult, base: Search) -> Criterion:
    """The size the probe recommends, at or under the real boundary: settled by a trial at
    it, or by the search's trials around it."""
    what, goal = f"{name}: the recommendation ran out of memory?", "no (≤ the real boundary)"
    if result.recommendation is None:
        return Criterion(what, "no recommendation", goal, False)
    size, bounds = result.recommendation.batch_size, base.bounds
    confirmed = result.confirmed_max
    probe = "the probe ran it" if confirmed and confirmed >= size else "the probe did not run it"
    fits = bounds.fits(size)
    if fits is True:
        measured = f"no: {size:,} ≤ {bounds.tried_fit:,}, which ran"
    elif fits is False:
        measured = f"yes: {size:,} ≥ {bounds.tried_fail:,}, which ran out of memory"
    else:
        measured = f"not settled: {size:,} ({base.error or 'no trial at or around it'})"
    return Criterion(what, f"{measured}; {probe}", goal, fits is True)


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
