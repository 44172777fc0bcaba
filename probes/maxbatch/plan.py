"""Probe planning and conclusions: pure functions, no torch.

Sizes: the first sidecar size is the job's own batch size (it calibrates the sidecar against
the job); the next ones aim at 60% and 90% of the largest batch the points so far predict,
so the memory line is fitted in the upper range it extrapolates into (fits from tiny batches
are what make other tools' predictions miss by 2-5x). At most three sizes; the probe stops at
the first one that does not fit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..wire.protocol import ProbePoint, Recommendation, WhatIf

MAX_SIZES = 3
MARGIN = 0.05  # taken off the predicted largest batch
SPEED_PLATEAU = 0.95  # "throughput stops rising": within 5% of the best measured


def line_fit(points: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares (intercept, slope) of y on x; None with fewer than two distinct x."""
    xs = [x for x, _ in points]
    if len(set(xs)) < 2:
        return None
    n = len(points)
    mean_x = sum(xs) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx
    return mean_y - slope * mean_x, slope


def largest_within(intercept: float, slope: float, budget: float) -> int | None:
    if slope <= 0:
        return None
    return max(0, math.floor((budget - intercept) / slope))


def next_size(
    current: int,
    measured: Sequence[ProbePoint],
    budget: int,
    max_size: int | None = None,
) -> int | None:
    """The next batch size for the sidecar to run, or None when the probe is done."""
    if len(measured) >= MAX_SIZES or (measured and not measured[-1].fits):
        return None
    if not measured:
        return _capped(current, max_size)
    fitted = [(float(p.batch_size), float(p.peak_bytes)) for p in measured if p.peak_bytes]
    fit = line_fit(fitted)
    if fit is None:  # one point: what a step adds to the memory held between steps, per sample
        biggest = max(measured, key=lambda p: p.batch_size)
        held = biggest.static_bytes or 0
        per_sample = max(1.0, ((biggest.peak_bytes or budget) - held) / biggest.batch_size)
        estimate = math.floor((budget - held) / per_sample)
    else:
        estimate = largest_within(*fit, budget) or 0
    target = 0.6 if len(measured) == 1 else 0.9
    largest_run = max(p.batch_size for p in measured)
    size = max(largest_run + 1, math.floor(target * estimate))
    if estimate <= largest_run:
        return None  # the points say nothing larger fits
    return _capped(size, max_size, above=largest_run)


def _capped(size: int, max_size: int | None, above: int = 0) -> int | None:
    if max_size is not None:
        size = min(size, max_size)
    return size if size > above else None


def conclude(
    points: Sequence[ProbePoint],
    budget: int,
    job_points: Sequence[tuple[int, int]] = (),
) -> tuple[int | None, float | None, tuple[float, float] | None]:
    """(predicted largest batch with the margin, extrapolation ratio, (intercept, slope)).

    The slope comes from the two largest sizes with a measured peak — a size that ran but went
    over the budget is a measurement too, and the most informative one (slopes from small
    sizes drown in measurement noise). The intercept is anchored on the job's own measured
    point when there is one, since the job's allocator, context and cached state are what the
    prediction is for.
    """
    measured = sorted((p for p in points if p.peak_bytes), key=lambda p: p.batch_size)[-2:]
    fitting = [p for p in points if p.fits]
    fit = line_fit([(p.batch_size, p.peak_bytes) for p in measured])  # type: ignore[misc]
    if fit is None or not fitting:
        return None, None, fit
    intercept, slope = fit
    if job_points:
        size, peak = max(job_points)
        intercept = peak - slope * size
    raw = largest_within(intercept, slope, budget)
    if raw is None:
        return None, None, fit
    failed = [p.batch_size for p in points if not p.fits]
    if failed:
        raw = min(raw, min(failed) - 1)  # never predict a size that already failed
    predicted = math.floor(raw * (1 - MARGIN))
    largest_run = max(p.batch_size for p in fitting)
    return predicted, raw / largest_run if largest_run else None, (intercept, slope)


def speed_size(points: Sequence[ProbePoint]) -> int | None:
    """The smallest measured size whose throughput is within 5% of the best one."""
    rated = [p for p in points if p.fits and p.samples_per_s]
    if not rated:
        return None
    best = max(p.samples_per_s for p in rated)  # type: ignore[type-var]
    return min(p.batch_size for p in rated if p.samples_per_s >= SPEED_PLATEAU * best)  # type: ignore[operator]


def recommend(
    points: Sequence[ProbePoint],
    memory_max: int | None,
    noise_scale: float | None,
    current: int,
    *,
    shared_cores: bool = False,
) -> Recommendation | None:
    """One size joining memory (largest fit), speed (where throughput stops rising) and the
    noise scale (beyond it, a larger batch buys little progress per sample)."""
    largest_run = max((p.batch_size for p in points if p.fits), default=None)
    ceiling = memory_max if memory_max is not None else largest_run
    if ceiling is None:
        return None
    reasons = [
        f"memory: up to {ceiling} is predicted to fit"
        if memory_max is not None
        else f"memory: {ceiling} is the largest size that ran"
    ]
    choice = ceiling
    fast = speed_size(points)
    if fast is not None and fast < choice:
        choice = fast
        shared = " (measured beside the job, on its CPU cores)" if shared_cores else ""
        reasons.append(f"speed: throughput stops rising at about {fast}{shared}")
    elif fast is not None:
        reasons.append("speed: throughput still rose at the largest size measured")
    if noise_scale is not None and noise_scale > 0:
        if choice > noise_scale:
            choice = max(current if current <= noise_scale else 1, math.floor(noise_scale))
            reasons.append(
                f"noise scale: B_simple ≈ {noise_scale:,.0f}; a larger batch mostly wastes samples"
            )
        else:
            reasons.append(f"noise scale: B_simple ≈ {noise_scale:,.0f} leaves room above")
    return Recommendation(batch_size=max(1, choice), reasons=reasons, current=current)


def accumulation_what_if(memory_max: int | None) -> WhatIf:
    note = (
        "any multiple of the micro-batch: k micro-batches per step keep memory at the "
        "micro-batch's (attach(micro_batch_size=...))"
    )
    return WhatIf(
        technique="gradient accumulation",
        max_batch_size=None,
        measured=False,
        note=f"{note}; micro-batch up to {memory_max}" if memory_max else note,
    )
