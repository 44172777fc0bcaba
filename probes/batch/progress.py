"""The measured signal: the progress per example a batch change made, from the job's own loss.

B_simple predicts what an example at a bigger batch is worth, ``E = (φ + B0)/(φ + B1)``, but
it can read far from the critical batch: McCandlish's own table puts B_simple/B_crit anywhere
in 0.05–8, and Merrill et al. (2025) measured the critical batch orders of magnitude above it
by branching training from checkpoints. bsmon cannot branch the job; it measures the branch the
job took against where the other was heading:

- **the base**: the loss windows at the old size since it began (a window with steps at two
  sizes is neither's), fitted by ``L = p + q·ln e`` (``e``: the job's examples so far), each
  window weighted by its examples. A loss not falling by ``Z_SLOPE`` standard errors is no
  base: nothing can be measured against it.
- **the change**: the windows at the new size fitted by ``L = p + q·ln(e_c + E·(e − e_c))``
  (``e_c``: the examples at the change), one parameter, ``E``, the worth of an example at the
  new size in examples at the old one, found on a log grid.
- **its interval**: the after-windows' scatter about the base line (its residual variance,
  inflated by ``(1 + ρ)/(1 − ρ)`` for its lag-1 autocorrelation ρ: an SGD iterate's loss
  wanders, so neighbouring windows are not independent) and the base line's own error where
  it is extrapolated, in quadrature, ``Z`` standard errors each way.
- **the critical batch it implies**: ``E`` solved for φ at each end of the interval,
  ``φ(E) = (E·B1 − B0)/(1 − E)``: the noise scale by the loss (``bounds``). An end at E ≥ 1
  bounds nothing above; one at E ≤ B0/B1 nothing below.

A measurement is made once ``MIN_AFTER`` windows ran at the new size, refreshed as they grow
by ``REFRESH``× (its cost stays a sum of a geometric series), and is final once the new size
ran ``AFTER_SHARE`` of the examples before the change or as many examples as the base spanned
(an extrapolation is not trusted further). The job's own
learning-rate decay and a new epoch both speed the loss's fall: inside a measurement they
read as a better change than it was (docs/autopilot.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..units import count

Z = 2.5  # standard errors each way (looked at after every window: wider than 1.96)
Z_SLOPE = 3.0  # a base line must fall by this many standard errors
MIN_BASE = 8  # windows at the old size
SPAN = 16.0  # a base is fitted over its last SPAN× of examples (see fit_base)
MIN_AFTER = 5  # windows at the new size before a first reading
AFTER_SHARE = 0.5  # of the examples before the change: final by then
MAX_RHO = 0.9
MAX_WINDOWS = 2_000  # a stretch's windows kept: beyond it, neighbours are merged in pairs
WIDE = 100.0  # an interval whose ends are this far apart tells nothing: the text says so
MAX_LOG = 700.0  # math.exp's argument stays below this (it raises past ~709)
REFRESH = 1.1  # a measurement is refreshed once its windows grew by this factor (or final)
GRID = np.exp(np.linspace(math.log(1 / 32), math.log(4), 241))  # E's candidates


@dataclass(frozen=True)
class Window:
    examples: float  # the job's examples at the window's middle
    loss: float  # its mean
    weight: float  # its examples


@dataclass(frozen=True)
class BaseLine:
    """``L = p + q·ln e`` over the old size's windows, and what its error needs."""

    p: float
    q: float
    variance: float  # per unit weight, inflated for autocorrelation
    weight: float  # Σ w
    mean_x: float  # weighted mean of ln e
    sxx: float  # Σ w (ln e − mean_x)²
    first: float  # examples at its first window and its last
    last: float
    windows: int

    def at(self, examples: float) -> float:
        return self.p + self.q * math.log(examples)

    def error_at(self, examples: float) -> float:
        """The standard error of the line's level at ``examples``."""
        x = math.log(examples)
        return math.sqrt(self.variance * (1 / self.weight + (x - self.mean_x) ** 2 / self.sxx))


def append_window(windows: list[Window], window: Window) -> None:
    """``window`` added; past ``MAX_WINDOWS``, neighbours merged in pairs (their examples
    summed, their mean loss and middle weighted by them), so a stretch of hours stays cheap."""
    windows.append(window)
    if len(windows) <= MAX_WINDOWS:
        return
    merged = [_merge(a, b) for a, b in zip(windows[::2], windows[1::2], strict=False)]
    if len(windows) % 2:
        merged.append(windows[-1])
    windows[:] = merged


def _merge(a: Window, b: Window) -> Window:
    weight = a.weight + b.weight
    middle = (a.examples * a.weight + b.examples * b.weight) / weight
    return Window(middle, (a.loss * a.weight + b.loss * b.weight) / weight, weight)


def fit_base(windows: Sequence[Window], span: float = SPAN) -> tuple[BaseLine | None, str]:
    """The base line over the windows of the last ``span``× of examples, or None and why
    there is none. A loss curve is straight in ``ln e`` only locally: over a stretch of hours
    SGD's loss bends toward its floor, and a line through all of it runs steeper than the
    stretch's end, where the base is carried on from."""
    if windows:
        since = windows[-1].examples / span
        windows = [window for window in windows if window.examples >= since]
    if len(windows) < MIN_BASE:
        return None, f"{len(windows)} loss windows at the old size, {MIN_BASE} needed"
    x = np.log([w.examples for w in windows])
    y = np.array([w.loss for w in windows])
    w = np.array([w.weight for w in windows])
    total = w.sum()
    mean_x, mean_y = (w * x).sum() / total, (w * y).sum() / total
    sxx = (w * (x - mean_x) ** 2).sum()
    if sxx <= 0:
        return None, "the old size's windows span no examples"
    q = (w * (x - mean_x) * (y - mean_y)).sum() / sxx
    p = mean_y - q * mean_x
    residual = y - (p + q * x)
    variance = (w * residual**2).sum() / (len(windows) - 2)
    variance *= _inflation(residual)
    if not (variance > 0 and q < 0 and -q > Z_SLOPE * math.sqrt(variance / sxx)):
        return None, "the loss at the old size was not measurably falling"
    line = BaseLine(
        float(p),
        float(q),
        float(variance),
        float(total),
        float(mean_x),
        float(sxx),
        windows[0].examples,
        windows[-1].examples,
        len(windows),
    )
    return line, ""


def _inflation(residual: np.ndarray) -> float:
    """(1 + ρ)/(1 − ρ) for the residuals' lag-1 autocorrelation ρ (≥ 0)."""
    centred = residual - residual.mean()
    denominator = (centred**2).sum()
    if denominator <= 0:
        return 1.0
    rho = min(max((centred[1:] * centred[:-1]).sum() / denominator, 0.0), MAX_RHO)
    return (1 + rho) / (1 - rho)


@dataclass(frozen=True)
class Progress:
    """A change's measured worth per example: ``efficiency`` in examples at ``old`` per
    example at ``new``, with its interval; ``final`` once no more windows will refine it."""

    old: int
    new: int
    step: int
    efficiency: float
    low: float
    high: float
    examples_before: float
    examples_after: float
    final: bool
    predicted: float | None = None  # B_simple's E at the change (None: not resolved)

    def bounds(self) -> tuple[float, float]:
        """The noise scale (φ, in a rank's examples) the interval allows, low end first."""
        ends = (implied_noise_scale(e, self.old, self.new) for e in (self.low, self.high))
        low, high = sorted(ends)
        return low, high

    def text(self) -> str:
        said = (
            f"batch {self.old} → {self.new} made {self.efficiency:.2f}× [{self.low:.2f}, "
            f"{ratio_text(self.high)}] of {self.old}'s progress per example (from the loss, "
            f"against {self.old}'s own curve carried on)"
        )
        if self.high > WIDE * self.low:
            said += f"; too wide to tell (the loss at {self.new} scatters about the curve)"
        if self.predicted is not None:
            said += f"; B_simple predicted {self.predicted:.2f}×"
        low, high = self.bounds()
        if low > 0 or math.isfinite(high):
            said += f"; the loss's noise scale: {bounds_text(low, high)}"
        return said


def scaled(value: float, log_factor: float) -> float:
    """``value·e^log_factor``, infinite where that is past a float (an interval's end from a
    loss too scattered to measure anything: math.exp raises there)."""
    return value * math.exp(log_factor) if log_factor < MAX_LOG else math.inf


def ratio_text(value: float) -> str:
    """``0.86``, or past 100 ``2e+07`` and ``∞``: an interval's far end stays short."""
    if math.isinf(value):
        return "∞"
    return f"{value:.2f}" if value < 100 else f"{value:.0e}"


def implied_noise_scale(efficiency: float, old: int, new: int) -> float:
    """φ with ``(φ + old)/(φ + new) = efficiency``, which lies between old/new (φ = 0) and 1
    (φ = ∞): beyond 1, ∞; beyond old/new, 0 (either way round: a change down too)."""
    towards_one = efficiency >= 1 if new > old else efficiency <= 1
    if towards_one:
        return math.inf
    if (efficiency <= old / new) if new > old else (efficiency >= old / new):
        return 0.0
    return (efficiency * new - old) / (1 - efficiency)


def bounds_text(low: float, high: float) -> str:
    if math.isinf(low):
        return "beyond measure (no cost per example)"
    if high <= 0:
        return "none (a step at the new size made less progress than one at the old)"
    if math.isinf(high):
        return f"≥ {count(low)}"
    if low <= 0:
        return f"≤ {count(high)}"
    return f"{count(low)}–{count(high)}"


def measure(
    base: BaseLine, after: list[Window], change: tuple[int, int, int, float]
) -> Progress | None:
    """The change ``(old, new, step, examples at the change)`` measured from the windows at
    the new size (None: too few yet)."""
    old, new, step, at = change
    if len(after) < MIN_AFTER:
        return None
    e = np.array([w.examples for w in after]) - at
    y = np.array([w.loss for w in after])
    w = np.array([w.weight for w in after])
    predicted = base.p + base.q * np.log(at + np.outer(GRID, e))  # (grid, windows)
    sse = (w * (y - predicted) ** 2).sum(axis=1)
    best = int(sse.argmin())
    efficiency = float(GRID[best])
    # on the log scale, so that the interval stays above zero
    half = Z * _spread(base, at, e, w, efficiency) / efficiency
    ran = after[-1].examples + after[-1].weight / 2 - at
    done = ran >= final_examples(base, at)
    return Progress(
        old=old,
        new=new,
        step=step,
        efficiency=efficiency,
        low=scaled(efficiency, -half),
        high=scaled(efficiency, half),
        examples_before=base.last - base.first,
        examples_after=float(ran),
        final=bool(done),
    )


def final_examples(base: BaseLine, at: float) -> float:
    """The examples at the new size that make a measurement final."""
    return min(AFTER_SHARE * at, base.last - base.first)


def expected_half_width(base: BaseLine, at: float) -> float:
    """The interval's half-width on the log scale a change kept pace per example would get
    once final, with windows as long in examples as the base's: whether a change from here
    could be measured at all."""
    weight = base.weight / base.windows
    e = np.arange(weight / 2, final_examples(base, at), weight)
    if len(e) < MIN_AFTER:
        return math.inf
    return Z * _spread(base, at, e, np.full(len(e), weight), 1.0)


def _spread(base: BaseLine, at: float, e: np.ndarray, w: np.ndarray, efficiency: float) -> float:
    """The standard error of ``efficiency`` from windows at ``e`` examples after the change,
    weighing ``w``: their scatter, and the base line's own error where it is carried on."""
    slope = base.q * e / (at + efficiency * e)  # ∂L/∂E at each window
    information = (w * slope**2).sum() / base.variance
    if information <= 0:
        return math.inf
    middle = at + float((w * e).sum() / w.sum())
    through_base = base.error_at(at + efficiency * (middle - at)) / abs(
        float((w * slope).sum() / w.sum())
    )
    return math.sqrt(1 / information + through_base**2)


STALE = 2.0  # an upper bound holds until the job's examples are this many times its last reading's


class ProgressMeter:
    """The windows at the size the job runs now, and the measurement of the latest change
    against the windows before it (agent thread). ``floor``: the highest noise scale a
    measurement has shown the loss to be above (the critical batch grows as training goes on,
    so it stands until a newer measurement reads below it); ``ceiling``: the latest finite
    upper end, which outlives the change back it leads to, until it is stale."""

    def __init__(self) -> None:
        self.latest: Progress | None = None
        self.why = "no change measured yet"  # why the latest change has no measurement
        self.floor = 0.0
        self.stretch: list[Window] = []  # the loss windows at the size the job runs now
        self._samples: int | None = None  # the job's examples at the last window's end
        self._change: tuple[int, int, int] | None = None  # old, new, step of the latest
        self._at: float | None = None  # the job's examples at it
        self._base: BaseLine | None = None
        self._predicted: float | None = None
        self._ceiling: tuple[float, int] | None = None  # the upper end, and the examples then
        self._refresh_at = MIN_AFTER  # windows after the change at the next measurement

    @property
    def changed(self) -> bool:
        """Whether a change was seen (measured or not)."""
        return self._change is not None

    def change(self, old: int, new: int, step: int, phi: float | None) -> None:
        """A change was applied at ``step``; ``phi``: B_simple then (None: not resolved)."""
        self._base, why = fit_base(self.stretch)
        self.why = f"batch {old} → {new}: {why}" if self._base is None else "measuring"
        self.stretch, self._change, self._at = [], (old, new, step), None
        self._refresh_at = MIN_AFTER
        self._predicted = (phi + old) / (phi + new) if phi is not None else None
        self.latest = None

    def observe(self, step: int, steps: int, samples: int | None, loss: float | None) -> bool:
        """One metrics window ending at ``step`` with the job's ``samples`` so far; True when
        it made the latest change's measurement final."""
        before, self._samples = self._samples, samples
        if samples is None or before is None or samples <= before or not steps:
            return False
        change = self._change
        if change is not None and self._at is None and step > change[2]:
            self._at = samples - (step - change[2]) * change[1]
            if step - steps < change[2]:
                return False  # steps at both sizes: neither's
        if loss is None or not math.isfinite(loss):
            return False
        window = Window(samples - (samples - before) / 2, loss, samples - before)
        append_window(self.stretch, window)
        return self._measure()

    def _measure(self) -> bool:
        if self._base is None or self._change is None or self._at is None:
            return False
        if self.latest is not None and self.latest.final:
            return False
        last = self.stretch[-1]
        final = last.examples + last.weight / 2 - self._at >= final_examples(self._base, self._at)
        if not final and len(self.stretch) < self._refresh_at:
            return False
        self._refresh_at = max(len(self.stretch) + 1, int(REFRESH * len(self.stretch)))
        old, new, step = self._change
        found = measure(self._base, self.stretch, (old, new, step, self._at))
        if found is None:
            return False
        if self._predicted is not None:
            found = replace(found, predicted=self._predicted)
        self.latest = found
        low, high = found.bounds()
        if high < self.floor:
            self.floor = low  # newer evidence below an older floor: the newer stands
        self.floor = max(self.floor, low)
        if math.isfinite(high):
            self._ceiling = (high, self._samples or 0)
        elif self._ceiling is not None and low > self._ceiling[0]:
            self._ceiling = None
        return found.final

    @property
    def ceiling(self) -> float:
        """The latest finite upper end a measurement put on the noise scale (∞: none, or
        stale: the job's examples have grown ``STALE``× since)."""
        if self._ceiling is None or self._samples is None:
            return math.inf
        high, at = self._ceiling
        return math.inf if self._samples > STALE * at else high
