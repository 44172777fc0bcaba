"""Mergeable stats and histograms, and compaction: bounded, exact, and events never dropped."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from bsmon.probes.record.buckets import (
    StatAcc,
    compact,
    count_step_bins,
    merge_spans,
    merge_stat,
    quantiles,
    step_bin,
    step_bin_value,
    target_level,
)
from bsmon.probes.wire.protocol import Event

from ..records import make_span


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def test_stats_merge_exactly_in_any_grouping():
    rng = random.Random(1)
    values = [rng.uniform(-5, 50) for _ in range(1000)]
    parts = []
    for start in range(0, 1000, 37):
        acc = StatAcc()
        for v in values[start : start + 37]:
            acc.add(v)
        parts.append(acc.stat())
    merged = None
    for part in parts:
        merged = merge_stat(merged, part)
    assert merged.n == 1000
    assert merged.min == min(values) and merged.max == max(values)
    assert merged.mean == pytest.approx(sum(values) / 1000, rel=1e-12)
    assert merge_stat(None, None) is None and merge_stat(parts[0], None) is parts[0]


def test_step_time_quantiles_are_within_a_bin_width():
    rng = random.Random(2)
    durations = [rng.lognormvariate(math.log(0.05), 0.6) for _ in range(20_000)]
    counts: dict[int, int] = {}
    for d in durations:
        counts[step_bin(d)] = counts.get(step_bin(d), 0) + 1
    estimates = quantiles(counts, (0.5, 0.95, 0.99), step_bin_value)
    for q, estimate in zip((0.5, 0.95, 0.99), estimates, strict=True):
        assert estimate == pytest.approx(nearest_rank(durations, q), rel=0.011)
    span_of_bins = math.log(max(durations) / min(durations)) / math.log(1.02)
    assert len(counts) <= span_of_bins + 2  # bounded by the range, not by the number of steps
    assert quantiles({}, (0.5,), step_bin_value) == [None]


def test_a_ticks_durations_are_binned_as_step_bin_bins_each():
    """The recorder bins a tick's durations by sorting them; every duration lands where
    ``step_bin`` puts it, those on a bin's edge (the float either side of it) included."""
    rng = random.Random(3)
    edges = [1.02**k for k in range(-400, -100, 7)]
    cases = [
        [rng.gauss(160e-6, 16e-6) for _ in range(600)],
        [rng.lognormvariate(math.log(0.05), 2.0) for _ in range(2000)],
        [x for e in edges for x in (e / 1.01, math.nextafter(e, 0.0), e, math.nextafter(e, 1.0))],
        [0.25] * 50,
        [1e-12, 3600.0, 1e-3],
        [],
    ]
    for durations in cases:
        expected: dict[int, int] = {7: 1}  # counts already there are added to
        for d in durations:
            expected[step_bin(d)] = expected.get(step_bin(d), 0) + 1
        counts = {7: 1}
        count_step_bins(durations, counts)
        assert counts == expected


def spans_over(seconds: int, bucket_s: float = 1.0) -> list:
    """One base span a bucket, with step times, loss and a GPU reading that all vary."""
    out, samples = [], 0
    for k in range(seconds):
        times = [0.01 + 0.0001 * ((k * 7 + i) % 50) for i in range(3)]
        span = make_span(
            k * bucket_s,
            (k + 1) * bucket_s,
            3 * k + 1,
            times,
            batch_size=16 if k < seconds // 2 else 32,
            samples_before=samples,
            loss=1.0 + math.sin(k),
            util=float((k * 13) % 101),
            mem_used=(k % 17) << 20,
        )
        samples = span.samples
        out.append(span)
    return out


def run_writer_schedule(items: list, per_level: int, bucket_s: float = 1.0) -> list:
    """Compact the way the writer does: after every ``per_level`` new spans, the whole file."""
    stored: list = []
    new = 0
    for item in items:
        stored.append(item)
        if not isinstance(item, Event):
            new += 1
        if new >= per_level:
            new = 0
            now = max(i.t1 for i in stored if not isinstance(i, Event))
            stored = list(
                compact(stored, start=0.0, now=now, bucket_s=bucket_s, per_level=per_level)
            )
    return stored


def test_compaction_stays_bounded_keeps_every_event_and_exact_aggregates():
    base = spans_over(20_000)
    events = [Event(t=k * 97.5, step=k, kind="e", message=f"event {k}") for k in range(200)]
    items = sorted([*base, *events], key=lambda i: i.t if isinstance(i, Event) else i.t1)
    per_level = 32
    stored = run_writer_schedule(items, per_level)
    spans = [i for i in stored if not isinstance(i, Event)]
    kept_events = [i for i in stored if isinstance(i, Event)]

    assert kept_events == events  # every event, in order
    levels = math.log2(20_000 / per_level + 1) + 1
    assert len(spans) <= per_level * (levels + 2) + 2 * 2  # O(per_level * log(run)); 2 batch sizes
    assert len(spans) < 500  # versus 20,000 base spans
    assert [s.t0 for s in spans] == sorted(s.t0 for s in spans)
    for a, b in itertools.pairwise(spans):
        assert a.t1 <= b.t0 + 1e-9  # no overlap, nothing counted twice
    assert spans[-1].n == 1  # the newest data keeps its full resolution
    assert max(s.n for s in spans) >= 64  # the oldest is merged
    assert sum(s.n for s in spans) == len(base)
    assert sum(s.steps for s in spans) == sum(s.steps for s in base)
    assert {s.batch_size for s in spans if s.t1 <= 10_000} == {16}  # never merged across sizes

    def total(pick):
        out = None
        for s in base:
            out = merge_stat(out, pick(s))
        return out

    for pick in (
        lambda s: s.step_time,
        lambda s: s.scalars["loss"],
        lambda s: s.devices[0].util,
        lambda s: s.devices[0].mem_used,
    ):
        expected, got = total(pick), None
        for s in spans:
            got = merge_stat(got, pick(s))
        assert (got.n, got.min, got.max) == (expected.n, expected.min, expected.max)
        assert got.mean == pytest.approx(expected.mean, rel=1e-9)
    hist: dict[int, int] = {}
    for s in spans:
        for key, count in s.step_hist.items():
            hist[key] = hist.get(key, 0) + count
    assert sum(hist.values()) == 3 * len(base)


def test_target_level_grows_with_age():
    assert [target_level(a, 10) for a in (0, 9.9, 10, 29.9, 30, 70, 150)] == [0, 0, 1, 1, 2, 3, 4]


def test_merge_keeps_cumulative_fields_from_the_later_span():
    a, b = spans_over(2)
    merged = merge_spans(a, b)
    assert (merged.t0, merged.t1, merged.step, merged.samples) == (a.t0, b.t1, b.step, b.samples)
    assert merged.steps == a.steps + b.steps and merged.n == 2
    assert merged.devices[0].util.n == 2


def test_the_allocators_peak_reserved_retries_and_ooms_survive_the_record_and_its_merges():
    from bsmon.probes.record.buckets import merge_devices
    from bsmon.probes.record.conversions import device_reading, device_span
    from bsmon.probes.wire.protocol import DeviceReading

    def reading(peak: int, retries: int, ooms: int) -> DeviceReading:
        return DeviceReading(
            index=0, torch_reserved_peak_bytes=peak, alloc_retries=retries, ooms=ooms
        )

    merged = merge_devices(device_span(reading(70, 12, 1)), device_span(reading(60, 3, 0)))
    back = device_reading(merged)
    assert (back.torch_reserved_peak_bytes, back.alloc_retries, back.ooms) == (70, 12, 1)
    old = device_reading(device_span(DeviceReading(index=0)))  # a reading without them
    assert (old.torch_reserved_peak_bytes, old.alloc_retries, old.ooms) == (None, None, None)
