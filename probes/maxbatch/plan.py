"""Probe planning and conclusions: pure functions, no torch.

Sizes: the first sidecar size is the job's own batch size (it calibrates the sidecar against
the job); the next ones aim at 60% and 90% of the largest batch the points so far predict,
so the memory line is fitted in the upper range it extrapolates into (fits from tiny batches
are what make other tools' predictions miss by 2-5x); the second, from one point, at most 8×
the first. At most three sizes; the probe stops at the first one that does not fit, except that an
out-of-memory error at the second (no reading: no slope) is followed by the size halfway
between, on a log scale.

Memory: a line through the two largest sizes, or — when the slope grows between the three
largest by more than measurement noise (pairwise terms, B×B matrices) — the parabola through
them. A size that ran out of memory without a reading (the fit had said it would fit) bounds
the prediction at halfway between it and the largest size that ran. On a GPU the allocator's
reserved bytes are fitted too: it runs out of memory when it
cannot reserve more, and block rounding and fragmentation make reserved grow faster than the
tensors it holds. The prediction is the smaller of the two.

Confirmation: the predicted size, less the margin, is run once more as a full step before it
is recommended (``confirmation_target``); when it does not fit, or cannot be tried, the
recommendation falls back to the largest size that ran.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..wire.protocol import ProbePoint, WhatIf

MAX_SIZES = 3
MARGIN = 0.05  # taken off the predicted largest batch
MAX_GROWTH = 8  # the next size is at most this many times the largest that ran
RUNAWAY_FACTOR = 1.5  # on the CPU, a sidecar this far over its budget is killed by the job
CPU_ALLOCATION_CAP = 0.9  # of that line: the sidecar's own allocations fail first
CURVE_TOLERANCE = 0.10  # slopes closer than this are one line
NOISE_SHARE = 0.10  # a rise below this share of the whole range is measurement noise


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
    if len(measured) >= MAX_SIZES:
        return None
    if not measured:
        return _capped(current, max_size)
    largest_run = max((p.batch_size for p in measured if p.fits), default=0)
    last = measured[-1]
    if not last.fits:  # an OOM tells nothing of the slope: halfway, on a log scale, once
        if last.peak_bytes or not largest_run:
            return None
        between = math.floor(math.sqrt(largest_run * last.batch_size))
        return between if largest_run < between < last.batch_size else None
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
    size = max(largest_run + 1, math.floor(target * estimate))
    if estimate <= largest_run:
        return None  # the points say nothing larger fits
    if fit is None:  # one point says nothing of how memory grows: a bounded step
        size = min(size, MAX_GROWTH * largest_run)
    return _capped(size, max_size, above=largest_run)


def _capped(size: int, max_size: int | None, above: int = 0) -> int | None:
    if max_size is not None:
        size = min(size, max_size)
    return size if size > above else None


@dataclass(frozen=True)
class MemoryFit:
    """Peak bytes against the batch size: intercept + slope·B + curvature·B²."""

    intercept: float
    slope: float
    curvature: float = 0.0

    def peak(self, size: float) -> float:
        return self.intercept + self.slope * size + self.curvature * size * size

    def largest_within(self, budget: float) -> int | None:
        """The largest batch whose peak is within ``budget``; None when memory does not grow."""
        if self.curvature <= 0:
            return largest_within(self.intercept, self.slope, budget)
        a, b, c = self.curvature, self.slope, self.intercept - budget
        discriminant = b * b - 4 * a * c
        if discriminant < 0:
            return 0
        return max(0, math.floor((-b + math.sqrt(discriminant)) / (2 * a)))

    def anchored(self, size: int, peak: float) -> MemoryFit:
        """The same shape through a measured (size, peak)."""
        return replace(self, intercept=self.intercept + peak - self.peak(size))

    def scaled(self, factor: float) -> MemoryFit:
        """The per-sample part scaled (a technique that changes what each sample costs)."""
        return replace(self, slope=self.slope * factor, curvature=self.curvature * factor)


def fit_memory(points: Sequence[ProbePoint], reserved: bool = False) -> MemoryFit | None:
    """The memory of the largest sizes measured: a line through the two largest, or the
    parabola through the three largest when the slope grows between them beyond noise."""

    def reading(p: ProbePoint) -> int | None:
        return p.reserved_bytes if reserved else p.peak_bytes

    measured = sorted(
        ((p.batch_size, reading(p)) for p in points if reading(p)), key=lambda xy: xy[0]
    )
    line = line_fit(measured[-2:])  # type: ignore[arg-type]
    if line is None:
        return None
    fit = MemoryFit(*line)
    if len(measured) < 3:
        return fit
    (x1, y1), (x2, y2), (x3, y3) = measured[-3:]
    if x1 == x2 or y3 <= y1 or (y2 - y1) < NOISE_SHARE * (y3 - y1):
        return fit
    low, high = (y2 - y1) / (x2 - x1), (y3 - y2) / (x3 - x2)
    if high <= low * (1 + CURVE_TOLERANCE):
        return fit
    curvature = (high - low) / (x3 - x1)
    slope = low - curvature * (x1 + x2)
    return MemoryFit(y1 - slope * x1 - curvature * x1 * x1, slope, curvature)


def conclude(
    points: Sequence[ProbePoint],
    budget: int,
    job_points: Sequence[tuple[int, int]] = (),
) -> tuple[int | None, float | None, MemoryFit | None]:
    """(predicted largest batch with the margin, extrapolation ratio, the memory fit).

    The fit comes from the largest sizes with a measured peak — a size that ran but went over
    the budget is a measurement too, and the most informative one (slopes from small sizes
    drown in measurement noise). The intercept is anchored on the job's own measured point
    when there is one, since the job's allocator, context and cached state are what the
    prediction is for.
    """
    fit = fit_memory(points)
    fitting = [p for p in points if p.fits]
    if fit is None or not fitting:
        return None, None, fit
    shift = 0.0
    if job_points:
        size, peak = max(job_points)
        shift = peak - fit.peak(size)
        fit = fit.anchored(size, peak)
    raw = fit.largest_within(budget)
    reserved = fit_memory(points, reserved=True)
    if reserved is not None and raw is not None:
        held = replace(reserved, intercept=reserved.intercept + shift)
        if (by_reserved := held.largest_within(budget)) is not None and by_reserved < raw:
            raw, fit = by_reserved, held
    if raw is None:
        return None, None, fit
    failed = [p.batch_size for p in points if not p.fits]
    if failed:
        raw = min(raw, min(failed) - 1)  # never predict a size that already failed
    largest_run = max(p.batch_size for p in fitting)
    unread = [p.batch_size for p in points if not p.fits and not p.peak_bytes]
    if unread and min(unread) > largest_run:  # the fit said it would fit: wrong beyond here
        raw = min(raw, (largest_run + min(unread)) // 2)
    predicted = math.floor(raw * (1 - MARGIN))
    return predicted, raw / largest_run if largest_run else None, fit


def confirmation_target(
    predicted: int | None,
    points: Sequence[ProbePoint],
    room: int | None = None,
    max_size: int | None = None,
) -> tuple[int | None, str]:
    """The size to run once more before it is recommended (None: nothing to run), and what
    a person reads when it is not the prediction itself. ``room`` is the largest size the
    sidecar itself has room for (a GPU shared with the job), when smaller."""
    largest = max((p.batch_size for p in points if p.fits), default=0)
    if predicted is None or not largest:
        return None, ""
    if predicted <= largest:
        return None, f"confirmed: {largest:,}, at or above the prediction, ran a full step"
    target, why = predicted, ""
    if max_size is not None and max_size < target:
        target, why = max_size, f" (the policy's largest, {max_size:,})"
    if room is not None and room < target:
        target = room
        why = f" (the sidecar had room for no more beside the job; {predicted:,} is untested)"
    if target <= largest:
        return None, (
            f"untested: {predicted:,} is a prediction{why}; {largest:,} is the largest size "
            "that ran"
        )
    return target, why


def confirmed_max(predicted: int | None, points: Sequence[ProbePoint]) -> int | None:
    """The largest batch a recommendation may use: the prediction when a size at least as
    large ran a full step, else the largest size that ran."""
    largest = max((p.batch_size for p in points if p.fits), default=None)
    if largest is None:
        return None
    return min(predicted, largest) if predicted is not None else largest


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
