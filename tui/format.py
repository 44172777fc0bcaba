"""The dashboard's number formatting: one formatter for every panel, axis and summary.

It lives in ``bsmon.probes.units`` (no textual), so the summary the job and ``bsmon export``
write uses the same units as the screen.
"""

from bsmon.probes.units import (
    NA,
    bar,
    bytes_,
    clock,
    count,
    duration,
    number,
    percent,
    rate,
    ticks,
)

__all__ = [
    "NA",
    "bar",
    "bytes_",
    "clock",
    "count",
    "duration",
    "number",
    "percent",
    "rate",
    "ticks",
]
