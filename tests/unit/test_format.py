"""Formatting of numbers for the dashboard."""

from __future__ import annotations

import itertools
import math

import pytest

from bsmon.tui import format as fmt


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "n/a"),
        (math.nan, "n/a"),
        (512, "512 B"),
        (1536, "1.5 KiB"),
        (3 * 1024**3, "3.0 GiB"),
        (2 * 1024**5, "2048.0 TiB"),
    ],
)
def test_bytes(value, text):
    assert fmt.bytes_(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "n/a"),
        (0.0005, "500 µs"),
        (0.0123, "12.3 ms"),
        (1.234, "1.23 s"),
        (185, "3m 05s"),
        (7380, "2h 03m"),
    ],
)
def test_duration(value, text):
    assert fmt.duration(value) == text


def test_clock_and_count():
    assert fmt.clock(3723) == "1:02:03"
    assert fmt.clock(90000) == "1d 1:00:00"
    assert (
        fmt.count(987) == "987" and fmt.count(12_300) == "12.3k" and fmt.count(4_560_000) == "4.56M"
    )
    assert fmt.rate(None) == "n/a"


def test_bar_fills_proportionally_and_clamps():
    assert fmt.bar(0.0, 8) == "░" * 8
    assert fmt.bar(1.0, 8) == "█" * 8
    assert fmt.bar(2.0, 4) == "████"
    assert fmt.bar(0.5, 8) == "████░░░░"
    assert len(fmt.bar(0.33, 10)) == 10
    assert fmt.bar(None, 3) == "···"


def is_round_spacing(step: float) -> bool:
    """1, 2, 2.5 or 5 times a power of ten."""
    mantissa = step / 10 ** math.floor(math.log10(step))
    return any(math.isclose(mantissa, m, rel_tol=1e-9) for m in (1, 2, 2.5, 5))


@pytest.mark.parametrize(
    ("lo", "hi", "count", "whole"),
    [
        (119, 13753, 5, True),  # the demo's steps, drawn once as 119.0 3527.5 6936.0
        (109, 4925, 5, True),
        (1, 3, 5, True),
        (5.3, 8.61, 3, False),  # step ms
        (7430.2, 12100.9, 2, False),  # samples/s, once labelled 8739.7
        (983.2, 1862.1, 4, False),  # the probe's samples/s
        (0.919, 2.3, 5, False),  # a loss
        (0.0012, 0.0031, 4, False),
        (0, 100, 5, False),
    ],
)
def test_axis_ticks_are_round_within_the_range_and_whole_where_asked(lo, hi, count, whole):
    ticks = fmt.ticks(lo, hi, count, whole=whole)
    assert 2 <= len(ticks) <= count
    assert all(lo <= t <= hi for t in ticks)
    step = ticks[1] - ticks[0]
    assert is_round_spacing(step), ticks
    assert all(math.isclose(t / step, round(t / step), abs_tol=1e-9) for t in ticks), ticks
    assert all(math.isclose(b - a, step) for a, b in itertools.pairwise(ticks))
    if whole:
        assert all(t == int(t) for t in ticks)
    labels = [fmt.count(t) for t in ticks]
    assert len(set(labels)) == len(labels) and not any(
        ".0k" in x or x.endswith(".0") for x in labels
    )


def test_a_flat_range_has_one_tick():
    assert fmt.ticks(3.0, 3.0) == [3.0]


def test_a_range_too_narrow_for_two_round_ticks_apart_takes_every_other_of_the_fewest():
    """1.63 to 2.3 in two rows: no round spacing gives exactly two; not the bare ends."""
    ticks = fmt.ticks(1.63, 2.3, 2)
    assert len(ticks) == 2 and all(1.63 <= t <= 2.3 for t in ticks)
    assert all(math.isclose(t * 10, round(t * 10)) for t in ticks), ticks  # 1.8 2.2, not 1.63
