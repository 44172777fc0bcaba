"""Readings in words: what the dashboard, the CLI and the job's own events say about a probe.

One wording everywhere, so ``bsmon probe`` and the probe screen never disagree.
"""

from __future__ import annotations

from .protocol import Advice, ProbeResult, Recommendation, WhatIf

FAR_EXTRAPOLATION = 3.0  # beyond this many times the largest run, a prediction is a guess

RAISE, BALANCED, TOO_BIG, TOO_EARLY = "raise B", "balanced", "B too big", "too early"


def noise_verdict(batch: int, b_simple: float, bound: bool = False) -> str:
    """What B_simple says about a batch of ``batch`` (McCandlish et al.'s eqs. 2.7 and 2.11):
    well below it (under half), raise it; well above it (over twice), it is too big; else
    balanced. ``bound``: ``b_simple`` is only a lower bound, which says to raise a batch below
    it and nothing yet about one above it. The one rule the Noise panel and the summary say."""
    if batch < (b_simple if bound else b_simple / 2):
        return RAISE
    if bound:
        return TOO_EARLY
    return TOO_BIG if batch > 2 * b_simple else BALANCED


def step_batch(batch: int, ranks: int) -> str:
    """A step's examples in words, from one rank's batch: B_simple counts the whole step's
    (``NoiseScaleReading.ranks``)."""
    if ranks <= 1:
        return f"{batch:,}"
    return f"{batch * ranks:,} ({batch:,} on each of {ranks} ranks)"


def extrapolation_note(extrapolation: float | None) -> str:
    if extrapolation is None:
        return ""
    if extrapolation > FAR_EXTRAPOLATION:
        return f"extrapolated {extrapolation:.1f}× beyond the largest run: low confidence"
    return f"extrapolated {extrapolation:.1f}×"


def batch_varies(span: tuple[int, int] | list[int] | None) -> str | None:
    """A batch size that varied step to step over ``span`` (least, most examples per step) in
    words, as the dashboard, its replay and the summary say it; None without a span."""
    return f"varies {span[0]:,}–{span[1]:,} per step" if span else None


def describe_prediction(result: ProbeResult) -> str | None:
    """The predicted largest batch in words, said to be a prediction, or None."""
    if result.predicted_max is None:
        return None
    budget = f"; budget {result.budget_bytes / 2**30:.1f} GiB" if result.budget_bytes else ""
    if budget and result.budget_note:
        budget += f": {result.budget_note}"
    shape = "line fit"
    if result.fit_curvature_bytes:
        shape = "curve fit: memory grows faster than the batch"
    confirmation = f"; {result.confirmation}" if result.confirmation else ""
    return (
        f"predicted largest: ≈{result.predicted_max:,} (a prediction: {shape}, "
        f"{result.margin:.0%} margin, {extrapolation_note(result.extrapolation)}{budget})"
        f"{confirmation}"
    )


def describe_what_if(what_if: WhatIf) -> str:
    """One line for a person: the technique, the predicted largest batch, and why or how."""
    size = f"≈{what_if.max_batch_size:,} (predicted)" if what_if.max_batch_size else "—"
    note = f" — {what_if.note}" if what_if.note else ""
    return f"{what_if.technique}: {size}{note}"


def describe_recommendation(recommendation: Recommendation) -> str:
    """``stay at 64`` when the recommendation is the job's batch size, else the size."""
    if recommendation.stay:
        return f"stay at {recommendation.batch_size:,}"
    return f"{recommendation.batch_size:,}"


def describe_advice(advice: Advice, lead: str = "advice") -> str:
    """The advisor's answer in one line: what, the reason that decided, how sure."""
    reason = advice.reasons[0] if advice.reasons else advice.why
    return f"{lead}: {advice.headline} ({reason}; confidence {advice.confidence})"
