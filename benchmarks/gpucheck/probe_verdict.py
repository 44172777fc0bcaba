"""The probe check's verdict (probe_check.py runs it): each model's criteria from its probe
and its brute-force searches, the tables of the report and its figures. What a search found
is judged on its bracket when it did not converge: a verdict holds when every boundary the
bracket allows gives it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bsmon.probes.wire.protocol import ProbeResult

from .boundary import Boundary
from .report import Criterion, Finding, Table

PREDICTION_GOAL = 0.05
WHAT_IF_GOAL = 0.10
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
