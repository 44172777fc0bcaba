"""Figures in summary.md's words: the dashboard's units (``probes.units``) where it has them,
and the few the summary writes its own way (durations to the minute, GiB, whole rates)."""

from __future__ import annotations

from .. import units


def num(value: float | None) -> str:
    return units.number(value)


def pct(value: float | None) -> str:
    return units.percent(value)


def ms(seconds: float | None) -> str:
    """A step's time in the dashboard's units: 850 µs, 12.3 ms, 1.35 s (not 1.35e+03 ms)."""
    return units.duration(seconds)


def rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def count(value: float) -> str:
    return units.count(round(value) if abs(value) < 1e3 else value)


def gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 2**30:.1f} GiB"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    s = round(seconds)
    if s < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{s} s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"
