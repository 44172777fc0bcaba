"""The decimating history keeps the whole run in bounded memory."""

from __future__ import annotations

import pytest

from bsmon.probes.record.history import DecimatingHistory, merge_points, metrics_history
from bsmon.probes.wire.protocol import MetricsPoint


def test_history_stays_bounded_and_reaches_back_to_the_start():
    history = metrics_history(capacity=64)
    for step in range(1, 10_001):
        history.append(MetricsPoint(t=float(step), step=step, steps=1, step_time_s=0.01))
    points = history.snapshot()
    assert len(points) <= 64
    assert points[0].step <= 10_000 // 32  # the first stored point covers the first steps
    assert points[-1].step == 10_000
    assert sum(p.steps for p in points) == 10_000  # no step counted twice or lost
    steps = [p.step for p in points]
    assert steps == sorted(steps)


def test_merge_weights_rates_by_steps_and_keeps_cumulative_fields_from_the_later_point():
    a = MetricsPoint(t=1, step=10, steps=1, step_time_s=1.0, samples=10, scalars={"loss": 4.0})
    b = MetricsPoint(
        t=2, step=13, steps=3, step_time_s=2.0, samples=40, scalars={"loss": 0.0, "acc": 1.0}
    )
    merged = merge_points(a, b)
    assert merged.step == 13 and merged.steps == 4 and merged.samples == 40
    assert merged.step_time_s == pytest.approx((1.0 * 1 + 2.0 * 3) / 4)
    assert merged.scalars["loss"] == pytest.approx(1.0)
    assert merged.scalars["acc"] == 1.0


def test_capacity_must_be_even_and_not_tiny():
    with pytest.raises(ValueError):
        DecimatingHistory(lambda a, b: b, capacity=3)
