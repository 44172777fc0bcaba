"""Formatting of numbers for the dashboard."""

from __future__ import annotations

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
