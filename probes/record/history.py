"""A bounded history that keeps the whole run at a uniform, coarsening resolution.

When the buffer fills, neighbouring points are merged pairwise and later points are merged
in groups of the new stride, so memory stays bounded while the history still reaches back to
the first step. A monitor that attaches an hour in therefore draws the full run at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from ..anatomy.window import anatomy_of, totals_of
from ..wire.protocol import MetricsPoint, StepAnatomy

T = TypeVar("T")


class DecimatingHistory(Generic[T]):
    def __init__(self, merge: Callable[[T, T], T], capacity: int = 2048) -> None:
        if capacity < 4 or capacity % 2:
            raise ValueError("capacity must be an even number of at least 4")
        self._merge = merge
        self._capacity = capacity
        self._points: list[T] = []
        self._stride = 1
        self._pending: T | None = None
        self._pending_count = 0

    @property
    def stride(self) -> int:
        """How many appended points each stored point stands for."""
        return self._stride

    def append(self, point: T) -> None:
        self._pending = point if self._pending is None else self._merge(self._pending, point)
        self._pending_count += 1
        if self._pending_count < self._stride:
            return
        self._points.append(self._pending)
        self._pending, self._pending_count = None, 0
        if len(self._points) >= self._capacity:
            merge = self._merge
            pts = self._points
            self._points = [merge(pts[i], pts[i + 1]) for i in range(0, len(pts), 2)]
            self._stride *= 2

    def __len__(self) -> int:
        return len(self._points) + (self._pending is not None)

    def __iter__(self) -> Iterator[T]:
        yield from self._points
        if self._pending is not None:
            yield self._pending

    def snapshot(self) -> tuple[T, ...]:
        return tuple(self)


def _weighted(a: float | None, wa: int, b: float | None, wb: int) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    total = wa + wb
    return (a * wa + b * wb) / total if total else (a + b) / 2


def merge_points(a: MetricsPoint, b: MetricsPoint) -> MetricsPoint:
    """Merge two consecutive points: cumulative fields from the later, rates weighted by steps."""
    wa, wb = max(a.steps, 1), max(b.steps, 1)
    scalars = dict(a.scalars)
    for key, value in b.scalars.items():
        scalars[key] = _weighted(scalars.get(key), wa, value, wb)  # type: ignore[assignment]
    return MetricsPoint(
        t=b.t,
        step=b.step,
        steps=a.steps + b.steps,
        batch_size=b.batch_size if b.batch_size is not None else a.batch_size,
        step_time_s=_weighted(a.step_time_s, wa, b.step_time_s, wb),
        samples_per_s=_weighted(a.samples_per_s, wa, b.samples_per_s, wb),
        samples=max(a.samples, b.samples),
        scalars=scalars,
        noise=b.noise if b.noise is not None else a.noise,
        anatomy=merge_anatomy(a.anatomy, b.anatomy),
    )


def merge_anatomy(a: StepAnatomy | None, b: StepAnatomy | None) -> StepAnatomy | None:
    """Two step anatomies as one over both their steps (the phases' totals summed)."""
    if a is None or b is None or not a.steps or not b.steps:
        return b if b is not None else a
    return anatomy_of(totals_of(a).merged(totals_of(b)), b.clock)


def metrics_history(capacity: int = 2048) -> DecimatingHistory[MetricsPoint]:
    return DecimatingHistory(merge_points, capacity)
