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
bracket allows gives it (probe_verdict.py judges what the searches found).
"""

from __future__ import annotations

import functools
import subprocess
import time

import msgspec

from bsmon.probes.wire.protocol import ProbeResult

from .boundary import Boundary, search_boundary
from .probe_verdict import GIB, PREDICTION_GOAL, WHAT_IF_GOAL, WHAT_IFS, ModelRun, Search, judge
from .procs import Children, Deadline, OutOfTime, read_json_line, run_json
from .report import Finding

FREE_GIB = 16.0
MODELS = ("resnet", "gpt")
TRIAL_S = 10.0  # a trial's wall time on the H100, CUDA start-up included (9–11 s measured)
TRIAL_TIMEOUT_S = 90.0
JOB_TIMEOUT_S = 150.0
PREDICTION_TOLERANCE = 0.01
PREDICTION_RUNS = 6
WHAT_IF_TOLERANCE = 0.03
WHAT_IF_RUNS = 4


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
