"""The dashboard's settings for this run of `bsmon`: one object, set from the command line.

``mode`` names what `q` does (the help says it): ``attach`` leaves the job running, ``demo``
stops the demo job, ``run`` stops the job `bsmon run` started (``d`` detaches), ``replay``
closes the record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Mode = Literal["attach", "demo", "run", "replay"]
DEFAULT_INTERVAL_S = 1.0
MIN_INTERVAL_S = 0.1
MAX_INTERVAL_S = 60.0
INTERVALS_S = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0)  # the steps of the [ and ] keys
DETACH = "detach"  # the app's result when `d` left a `bsmon run` job running


@dataclass
class Settings:
    interval_s: float = DEFAULT_INTERVAL_S  # how often the dashboard redraws
    mode: Mode = "attach"


settings = Settings()


def next_interval(current: float, direction: int) -> float:
    """The next step of INTERVALS_S from ``current`` (direction +1 longer, -1 shorter)."""
    if direction > 0:
        return next((s for s in INTERVALS_S if s > current + 1e-9), INTERVALS_S[-1])
    return next((s for s in reversed(INTERVALS_S) if s < current - 1e-9), INTERVALS_S[0])


def interval_text(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:g} s"
