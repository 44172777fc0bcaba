"""Human-readable numbers: one set of units for the dashboard (``bsmon.tui.format``), the
chart axes and the session summary. Every formatter turns ``None`` into "n/a"."""

from __future__ import annotations

import math

NA = "n/a"


def _missing(value: float | None) -> bool:
    return value is None or (isinstance(value, float) and not math.isfinite(value))


def bytes_(value: float | None) -> str:
    if _missing(value):
        return NA
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    size = float(value)  # type: ignore[arg-type]
    for unit in units:
        if abs(size) < 1024 or unit == units[-1]:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def duration(seconds: float | None) -> str:
    """Step-scale durations: 850 µs, 12.3 ms, 1.24 s, 3m 05s, 2h 03m."""
    if _missing(seconds):
        return NA
    s = float(seconds)  # type: ignore[arg-type]
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    if s < 60:
        return f"{s:.2f} s"
    if s < 3600:
        return f"{int(s // 60)}m {int(s % 60):02d}s"
    return f"{int(s // 3600)}h {int(s % 3600 // 60):02d}m"


def clock(seconds: float | None) -> str:
    """Elapsed time as H:MM:SS (days prefixed when longer)."""
    if _missing(seconds):
        return NA
    total = max(0, int(seconds))  # type: ignore[arg-type]
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{days}d {text}" if days else text


def count(value: float | None) -> str:
    """Large counts compactly: 987, 12.3k, 4.56M."""
    if _missing(value):
        return NA
    v = float(value)  # type: ignore[arg-type]
    for threshold, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= threshold:
            return f"{v / threshold:.3g}{suffix}"
    return f"{v:.0f}" if v == int(v) else f"{v:.3g}"


def ticks(lo: float, hi: float, count: int = 5, whole: bool = False) -> list[float]:
    """Round axis ticks within [lo, hi], multiples of 1, 2, 2.5 or 5 times a power of ten: as
    many as fit in ``count`` (at least two), so labels read 2.5k 5k 7.5k, never 3527.5
    (``whole``: whole numbers only, as steps and batch sizes are). ``[lo]`` for a point."""
    span = hi - lo
    if _missing(lo) or _missing(hi) or span <= 0 or count < 1:
        return [lo]
    fits: list[tuple[int, float, int]] = []  # how many, spacing, first multiple
    top = math.floor(math.log10(span))
    for power in range(top, top - 3, -1):
        for factor in (5, 2.5, 2, 1):
            step = factor * 10.0**power
            first = math.ceil(lo / step)
            n = math.floor(hi / step) - first + 1
            if n >= 2 and not (whole and step != int(step)):
                fits.append((n, step, first))
    if not fits:
        return [lo, hi]
    within = [f for f in fits if f[0] <= count]
    # the most that fit (the widest spacing among equals), else every other of the fewest
    n, step, first = max(within, key=lambda f: (f[0], f[1])) if within else min(fits)
    values = [round((first + i) * step, 12) for i in range(n)]
    return values if within else values[:: math.ceil(n / max(count, 2))]


def labelled_ticks(
    lo: float, hi: float, most: int = 5, whole: bool = False
) -> tuple[list[float], list[str]]:
    """``ticks`` and their labels in these units (2.5k), as plotext's xticks/yticks take them."""
    at = ticks(lo, hi, most, whole)
    return at, [count(t) for t in at]


def rate(value: float | None, unit: str = "/s") -> str:
    return NA if _missing(value) else f"{count(value)}{unit}"


def number(value: float | None, digits: int = 4) -> str:
    if _missing(value):
        return NA
    return f"{value:.{digits}g}"


def percent(value: float | None) -> str:
    return NA if _missing(value) else f"{value:.0f}%"


def bar(fraction: float | None, width: int) -> str:
    """A meter of ``width`` cells using eighth blocks; empty cells are light shade."""
    if width <= 0:
        return ""
    if _missing(fraction):
        return "·" * width
    f = min(1.0, max(0.0, float(fraction)))  # type: ignore[arg-type]
    eighths = round(f * width * 8)
    full, part = divmod(eighths, 8)
    partial = " ▏▎▍▌▋▊▉"[part] if part else ""
    return ("█" * full + partial.strip()).ljust(width, "░")[:width]
