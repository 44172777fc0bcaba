"""Reading B_simple now, not where the averages sit: a correction for its growth.

The averages behind the estimate reach back hundreds of training steps when the cost budget
measures one step in fifty, since they must hold enough measured steps to be precise. While
training moves B_simple (it grows as the loss falls, often tenfold over the first thousands
of steps), their ratio is B_simple as it was at an earlier step ``t_eff`` (the averages'
``log_step``: early steps, whose |G|² is large, weigh most), not at ``t``: at bsmon's
defaults the live value read 0.4–0.5 of the exact one on a growing run, with an interval
that did not cover it.

Training changes B_simple roughly as a power of the step count (McCandlish et al. 2018 show
it rising smoothly with progress), so the correction works in log-log terms: the estimate's
own history gives the exponent ``p = Δ ln B / Δ ln t_eff`` between the averages' effective
step now and the one about a quarter as far into the run (a long lever: compared with half
as far, a B_simple that held still was read forward by up to 24% on the closed-form
regression measured one step in ten, and by nothing with a quarter), and

    B(t) ≈ B(t_eff) · (t / t_eff)^p.

The exponent is noisy (two estimates, each with its standard error), so:

- the point estimate moves by ``p`` shrunk towards zero by one standard error (a stationary
  B_simple, whose p is zero within its error, is left where it is), and never further than
  from half the step to the step (a sparsely measured run's averages can sit further back:
  its reading then stays partly behind, and its interval says so);
- the interval moves by the whole range ``p ± z·se`` over the whole distance the averages
  lag: it widens on the side the estimate may lag, so a lagging point never comes with a
  narrow interval. Where they lag further than the stretch ``p`` was measured over, the
  rest of the distance takes, upwards, any exponent training could give
  (``EXPONENT_RANGE``): a trend seen over one doubling of steps says little about the next
  eight, and a lag that long means the early steps' |G|² outweighs the later ones' (below).

The reading is carried to the step it is read at, not to the latest measured one: where the
cost budget spends its warm-up's allowance at once and then measures nothing for hundreds
of steps, the estimate was read as of step 50 while the job was at 384, its interval as
narrow as then (the tracking benchmark's transformer: [57, 97] against an exact 523). Before
the history gives an exponent, the interval widens by any exponent training could give
(``EXPONENT_RANGE``): downwards over the steps since the latest measured one, upwards over
those since the averages' effective step; the point stays. The upward distance is not the one
from the latest measured step: on the same transformer the first 40 steps' |G|², 30× the
later steps', held the effective step at 11–12 from step 48 to step 192 while steps went on
being measured, so the averages never moved far enough for an exponent, and the interval,
widened from the latest measured step, read [76, 159] at step 192 against an exact 430.
The averages' ratio weighs each step by its |G|², so an effective step far behind means the
early steps had the larger |G|², and (for a like tr Σ) the smaller B_simple: the lag reads
low, and the interval opens upwards for it. Downwards it widens as before, over the steps
since the latest measured one: the autopilot and the advice grow by the interval's low end,
and opened downwards from the effective step too, the transformer's read [5, 9,799] at step
192, a low end that tells growth nothing.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from typing import Protocol

from .smoothing import Z95, Estimate

MIN_SPAN = math.log(1.25)  # the two effective steps compared lie at least this far apart
BASE = 0.25  # the earlier estimate is the one whose effective step is about a quarter of now's
SPACING = 1.02  # the history keeps points this far apart in effective step (about 70 a doubling)
EXPONENT_RANGE = (-1.0, 1.5)  # what training does to B_simple, with room to spare
MAX_REACH = math.log(2.0)  # never read forward further than twice the effective step
MAX_LAG = math.log(16.0)  # the interval's reach (an effective step 1/16 of now: far behind)


@dataclass(frozen=True, slots=True)
class Growth:
    """The correction applied: ``exponent`` p (shrunk), its standard error, and the factor
    ``(t / t_eff)^p`` the averages' ratio was multiplied by."""

    exponent: float
    stderr: float
    factor: float


class Averages(Protocol):
    """What the correction reads of the averages (drift.DriftFollowingRatio)."""

    @property
    def mean_age(self) -> float: ...

    @property
    def log_step(self) -> float | None: ...

    def estimate(self) -> Estimate: ...


def effective_step(averages: Averages, step: int) -> float:
    """The step the averages' ratio stands for (their |G|²-weighted log step; else the mean
    age back from ``step``)."""
    log_step = averages.log_step
    if log_step is not None and 0.0 <= log_step <= math.log(max(step, 1)):
        return math.exp(log_step)
    return max(1.0, step - averages.mean_age)


@dataclass(frozen=True, slots=True)
class _Point:
    effective_step: float
    log_b: float
    rel_var: float  # (se / B)²


class GrowthCorrection:
    def __init__(self) -> None:
        self._history: deque[_Point] = deque()  # log-spaced in effective step
        self._latest: _Point | None = None

    def reset(self) -> None:
        self._history.clear()
        self._latest = None

    def observe(self, step: int, averages: Averages) -> None:
        """After each update of the averages (the latest at training step ``step``):
        remember where the estimate stood."""
        est = averages.estimate()
        if not (est.b_simple and est.b_simple > 0 and est.stderr is not None):
            return
        effective = effective_step(averages, step)
        point = _Point(effective, math.log(est.b_simple), (est.stderr / est.b_simple) ** 2)
        self._latest = point
        history = self._history
        while history and history[-1].effective_step >= effective:
            history.pop()  # the averages restarted nearer to now: keep the history ordered
        if not history or effective >= history[-1].effective_step * SPACING:
            history.append(point)
        while len(history) > 1 and history[1].effective_step <= effective * BASE / 2:
            history.popleft()

    def exponent(self) -> tuple[float, float, float] | None:
        """p, its standard error and the span ln(t₂/t₁) of effective steps it was measured
        over, from the latest estimate and the one about a quarter as far into the run; None
        while the history spans too little."""
        latest = self._latest
        if latest is None or not self._history:
            return None
        target = latest.effective_step * BASE
        earlier = min(self._history, key=lambda p: abs(p.effective_step - target))
        span = math.log(latest.effective_step / earlier.effective_step)
        if span < MIN_SPAN:
            return None
        low, high = EXPONENT_RANGE
        p = min(max((latest.log_b - earlier.log_b) / span, low), high)
        # the two estimates share some steps, so adding their variances overstates the
        # difference's: a cautious standard error
        return p, math.sqrt(latest.rel_var + earlier.rel_var) / span, span

    def apply(
        self, step: int, averages: Averages, measured: int | None = None
    ) -> tuple[Estimate, Growth | None]:
        """The averages' estimate carried from their effective step to ``step``; ``measured``:
        the latest measured step (``step`` itself when None)."""
        est = averages.estimate()
        if est.b_simple is None or est.stderr is None:
            return est, None
        found = self.exponent()
        if found is None:
            return stale(
                est, step, measured or step, effective_step(averages, measured or step)
            ), None
        behind = math.log(max(step, 1) / effective_step(averages, step))  # ln(t / t_eff)
        if behind <= 0:
            return est, None
        p, se, span = found
        shrunk = math.copysign(max(0.0, abs(p) - se), p)
        x = min(behind, MAX_REACH)
        factor = math.exp(shrunk * x)
        b = est.b_simple * factor
        rel = math.hypot(est.stderr / est.b_simple, se * x)
        # the interval reaches as far as the averages lag (up to 16×), with any exponent
        # within the range of p's error; upwards, beyond the stretch p was measured over,
        # with any exponent training could give (a trend seen over a short stretch says
        # little about a long one: the burst of steps a warm-up measures at the start)
        lag = min(behind, MAX_LAG)
        bottom, top = EXPONENT_RANGE
        slowest, fastest = max(p - Z95 * se, bottom), min(p + Z95 * se, top)
        unseen = max(0.0, lag - span)
        up = math.exp(max(0.0, fastest) * (lag - unseen) + top * unseen)
        low = est.ci_low * math.exp(min(0.0, slowest * lag)) if est.ci_low else est.ci_low
        high = est.ci_high * up if est.ci_high else None
        corrected = replace(est, b_simple=b, stderr=b * rel, ci_low=low, ci_high=high)
        return corrected, Growth(shrunk, se, factor)


def stale(est: Estimate, step: int, measured: int, stands_for: float) -> Estimate:
    """``est``, last fed at step ``measured``, its ratio standing for step ``stands_for`` (the
    averages' effective step), read at ``step`` with no trend known: its interval widened by
    what any exponent in ``EXPONENT_RANGE`` could have done, downwards since ``measured`` and
    upwards since ``stands_for``. The ratio of the averages weighs each step by its |G|², so
    an effective step far behind the latest measured one means the early steps had the larger
    |G|² and, for a like tr Σ, the smaller B_simple: it reads low, not high."""
    bottom, top = EXPONENT_RANGE
    down = min(math.log(step / measured), MAX_LAG) if step > measured >= 1 else 0.0
    up = min(math.log(step / stands_for), MAX_LAG) if step > stands_for >= 1 else 0.0
    if not (down or up):
        return est
    low = est.ci_low * math.exp(bottom * down) if est.ci_low else est.ci_low
    high = est.ci_high * math.exp(top * up) if est.ci_high else None
    return replace(est, ci_low=low, ci_high=high)


def describe_growth(growth: Growth) -> str:
    """The correction in words, for the reading's detail."""
    trend = "growing" if growth.exponent > 0 else "falling"
    return (
        f"B_simple {trend} as steps^{growth.exponent:.2f} (±{growth.stderr:.2f}): the averages' "
        f"value read forward ×{growth.factor:.2f} to the latest step"
    )
