"""The gain the autopilot claims: its progress per second, over the spans it drove, against a
fixed batch of the size it was switched on at, from what was measured.

**Measured, where it can be**: the loss windows at a span's base size before its first change,
since that size was set (switched on mid-run, the windows before the switch-on too), are the
base's own curve (``progress.fit_base``: ``L = p + q·ln e`` over its recent stretch). The loss
the run has reached now (the median of its last ``RECENT`` windows) is where that curve would
be after ``e0`` examples; a fixed base would take ``e0`` less the examples at the switch-on, at
its measured throughput, in seconds; the claim is those seconds over the seconds the span took.
It sees what happened: a run that stalled, or lost per example more than its speed bought,
claims below 1 (a loss, never a gain). It is made only where the base's curve was measured
(``MIN_BASE`` windows falling measurably), is not carried more than ``REACH``× past the
examples it was measured over, and is tight: ``e0``'s error (the reached loss's scatter and
the line's own error there, through its slope; ``CLAIM_Z`` each way) keeps the claim within
``CLAIM_SPREAD``× each way. Near a loss's floor the curve is flat, a small scatter in the loss
is a wide one in examples, and a line carried on runs ahead of a curve that bends: on
``benchmarks/autopilot.py``'s T3 a fixed 16's own curve, carried 1.5–4× on, put the examples
to its later losses at 0.2–30× the true ones, every time with an interval this check refuses.
Else the model's claim below stands, and says it is unsure, and why.

**The model's claim**, otherwise:

A span runs from a switch-on to the moment it stops steering (off, paused by a key, refused);
a change made while it was off is not its own, and neither is the time before it was switched
on. Within a span each metrics window adds its timed seconds and its samples, weighted by the
efficiency at the noise scale of that moment, ``(φ + B0)/(φ + B)`` (``goodput``): what they
are worth in samples at the span's base size B0. A span's worth over the base size's measured
throughput is the seconds a fixed B0 would need for it; the claim is those seconds, summed
over the spans, over the seconds taken. A base size must have run, so the claim is never
against a batch that was not measured, and a run in which it made no decision claims nothing.

A size's throughput is what bsmon costs it as usual: its windows once the noise scale's
warm-up is over, whether the autopilot was on or not. The warm-up measures three steps in
four, so its windows at a base size are left out of the claim. A fast ramp leaves the run's
first size during the warm-up; then that size's throughput is its steps the noise scale did
not measure (the budget's plain steps, before the batch first changed). Against the warm-up's
windows the claim read +30% on ``benchmarks/autopilot.py``'s T1, and a run that never changed
size claimed 0.91×.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..noise.controller import WARMING_UP
from ..units import count
from ..wire.protocol import Metrics
from .goodput import efficiency_ratio
from .progress import BaseLine, Window, append_window, fit_base, ratio_text, scaled

HOW = "measured throughput at each size × the noise scale's efficiency, over the steps it drove"
MEASURED = "the loss it reached, by the base's own curve at the base's measured throughput"
RECENT = 5  # loss windows whose median is where the run stands
REACH = 4.0  # a base's curve is not carried past this many times the examples it covered
CLAIM_Z = 2.0  # standard errors each way of a measured claim's interval
CLAIM_SPREAD = 1.25  # a measured claim's interval lies within this factor of it each way


@dataclass
class Span:
    """From a switch-on at ``base`` (at ``step``) to where it stopped steering (``end``: None
    while it steers)."""

    base: int
    step: int
    end: int | None = None
    decisions: int = 0
    seconds: float = 0.0  # timed seconds in the windows counted
    worth: float = 0.0  # their samples, each weighted by its efficiency against ``base``
    warming: int = 0  # windows at ``base`` left out: the noise scale's warm-up
    unweighed: int = 0  # windows at another size before the noise scale resolved
    examples: int = 0  # the job's, at the switch-on
    timed: float = 0.0  # every timed second it drove, the warm-up's too
    curve: list[Window] = field(default_factory=list)  # the loss at ``base`` before it left
    left: bool = False  # it has left ``base``
    fit: tuple[BaseLine | None, str] | None = None  # the curve's line, once it left

    def fitted(self) -> tuple[BaseLine | None, str]:
        """The base's own curve (fitted again while it still runs at ``base``)."""
        if self.fit is None or not self.left:
            self.fit = fit_base(self.curve)
        return self.fit

    def text(self, size: int) -> str:
        """``16 → 256 in 4 decisions`` (``size``: where an open span stands now)."""
        end = self.end if self.end is not None else size
        return f"{self.base} → {end} in {self.decisions} decision{_s(self.decisions)}"


class GainLedger:
    def __init__(self, first_size: int) -> None:
        self.spans: list[Span] = []
        self._first_size = first_size  # the run's: its plain steps may price it (above)
        self._left_first = False
        self._first_plain_s: float | None = None
        self._phi: float | None = None  # the latest resolved noise scale
        self._measured: dict[int, list[float]] = {}  # size → [samples, seconds] after warm-up
        self._samples: int | None = 0  # the job's examples (counted from the attach) so far
        self._recent: deque[float] = deque(maxlen=RECENT)  # the latest windows' losses

    @property
    def driving(self) -> Span | None:
        """The span it steers now (None: it is not steering)."""
        return self.spans[-1] if self.spans and self.spans[-1].end is None else None

    def begin(self, size: int, step: int, curve: Sequence[Window] = ()) -> None:
        """Switched on at ``size``: a span of its own, against a fixed ``size``; ``curve``:
        the loss windows the job ran at ``size`` before (switched on an hour into a run, the
        base's own curve is that hour, not the few windows before its first change)."""
        if self.driving is None:
            span = Span(base=size, step=step, examples=self._samples or 0, curve=list(curve))
            self.spans.append(span)

    def end(self, size: int) -> None:
        """It stopped steering with the batch at ``size``."""
        if (span := self.driving) is not None:
            span.end = size

    def decided(self) -> None:
        if (span := self.driving) is not None:
            span.decisions += 1

    @property
    def decisions(self) -> int:
        return sum(span.decisions for span in self.spans)

    def add(self, metrics: Metrics, phi: float | None, plain_step_s: float | None = None) -> None:
        """One metrics window; ``phi``: the noise scale now (None: not resolved);
        ``plain_step_s``: a recent step's time the noise scale did not measure, if known."""
        if phi is not None:
            self._phi = phi
        self._follow_loss(metrics)
        size, step_time, steps = metrics.batch_size, metrics.step_time_s, metrics.steps_in_window
        self._left_first = self._left_first or size != self._first_size
        rate = metrics.samples_per_s
        if not size or not step_time or not steps or not rate:
            return
        seconds = step_time * steps
        warming = metrics.noise is not None and metrics.noise.phase == WARMING_UP
        if warming and size == self._first_size and not self._left_first and plain_step_s:
            self._first_plain_s = plain_step_s
        if not warming:
            measured = self._measured.setdefault(size, [0.0, 0.0])
            measured[0] += rate * seconds
            measured[1] += seconds
        if (span := self.driving) is not None:
            span.timed += seconds
            self._count(span, size, rate * seconds, seconds, warming)

    def _follow_loss(self, metrics: Metrics) -> None:
        """The loss windows: the latest few, and a span's base curve until it leaves."""
        before, self._samples = self._samples, metrics.samples
        loss = metrics.scalars.get("loss")
        if before is None or not metrics.samples or metrics.samples <= before:
            return
        if loss is None or not math.isfinite(loss):
            return
        self._recent.append(loss)
        span = self.driving
        if span is None or span.left:
            return
        if metrics.batch_size != span.base:
            span.left = True
            return
        middle = metrics.samples - (metrics.samples - before) / 2
        append_window(span.curve, Window(middle, loss, metrics.samples - before))

    def _count(self, span: Span, size: int, samples: float, seconds: float, warming: bool) -> None:
        if size == span.base:
            if warming:
                span.warming += 1
                return
            efficiency = 1.0
        elif self._phi is None:
            span.unweighed += 1  # no noise scale yet: a window at another size cannot be weighed
            return
        else:
            efficiency = efficiency_ratio(size, span.base, self._phi)
        span.seconds += seconds
        span.worth += samples * efficiency

    def claim(self) -> tuple[float | None, str]:
        """The gain over the spans it drove, against a fixed batch of the size each began at,
        and how it was made (or why there is none): measured from the loss where it can be,
        else the model's, unsure."""
        if not self.spans:
            return None, "it was not switched on"
        if not self.decisions:
            return None, "it made no change"
        measured, said = self._measured_claim()
        if measured is not None:
            return measured, f"against a fixed batch of {self._bases()}: {MEASURED} ({said})"
        modelled, how = self._modelled_claim()
        if modelled is None:
            return None, how
        return modelled, f"{how}; unsure, not measured from the loss: {said}"

    def _measured_claim(self) -> tuple[float | None, str]:
        """The seconds fixed bases would take to the loss reached, over those taken, and its
        interval as text (None: not measurable, and why)."""
        if len(self._recent) < RECENT or self._samples is None:
            return None, f"fewer than {RECENT} loss windows logged"
        if len(self.spans) > 1:
            return None, "it was switched on more than once"
        (span,) = self.spans
        base, why = span.fitted()
        if base is None:
            return None, f"batch {span.base}'s own curve: {why.replace('old size', 'base')}"
        examples = _examples_to(base, statistics.median(self._recent))
        if examples > REACH * base.last:
            return None, (
                f"the loss reached lies beyond batch {span.base}'s own curve (measured to "
                f"{count(base.last)} examples, it would reach it after {count(examples)})"
            )
        if (rate := self._rate(span.base)) is None or not span.timed:
            return None, f"batch {span.base}'s throughput was not measured"

        def gain(at: float) -> float:
            return max(at - span.examples, 0.0) / rate / span.timed

        spread = CLAIM_Z * _log_examples_error(base, examples)
        claimed = gain(examples)
        low, high = gain(scaled(examples, -spread)), gain(scaled(examples, spread))
        interval = f"{claimed:.2f}× [{low:.2f}, {ratio_text(high)}]"
        if low * CLAIM_SPREAD < claimed or high > CLAIM_SPREAD * claimed:
            return None, (
                f"batch {span.base}'s own curve carried to the loss reached gives {interval}, "
                "too wide to claim"
            )
        return claimed, interval

    def _modelled_claim(self) -> tuple[float | None, str]:
        needed = taken = 0.0
        why: list[str] = []
        for span in self.spans:
            if (rate := self._rate(span.base)) is None:
                why.append(
                    f"the batch {span.base} it was switched on at was not measured long enough"
                )
            elif not span.seconds:
                why.append(self._nothing_counted(span))
            else:
                needed += span.worth / rate
                taken += span.seconds
        if not taken:
            return None, "; ".join(dict.fromkeys(why))
        return needed / taken, f"against a fixed batch of {self._bases()}: {HOW}"

    def _rate(self, size: int) -> float | None:
        """``size``'s measured throughput (None: not measured after the warm-up, nor its plain
        steps before the run first left it)."""
        samples, seconds = self._measured.get(size, (0.0, 0.0))
        if seconds:
            return samples / seconds
        if size == self._first_size and self._first_plain_s:
            return size / self._first_plain_s
        return None

    def _bases(self) -> str:
        """``16``, or ``the size it was switched on at (16 at step 0, 128 at step 2,000)``."""
        if len({span.base for span in self.spans}) == 1:
            return str(self.spans[0].base)
        each = ", ".join(f"{span.base} at step {span.step:,}" for span in self.spans)
        return f"the size it was switched on at ({each})"

    @staticmethod
    def _nothing_counted(span: Span) -> str:
        """Why no window of ``span`` counts toward the claim, though its base has a rate."""
        why = []
        if span.warming:
            why.append(
                f"batch {span.base} ran only in the noise scale's warm-up, whose windows "
                "are left out (it measures three steps in four)"
            )
        if span.unweighed:
            why.append("the other sizes ran before B_simple resolved")
        return "; ".join(why) or "no timed window yet"


def _log_examples_error(base: BaseLine, examples: float) -> float:
    """The standard error of ``ln examples`` where the base's curve reaches the loss reached:
    the median of ``RECENT`` windows (of the base's mean weight) and the line's own error
    there, through its slope."""
    window_variance = base.variance * base.windows / base.weight
    reached = window_variance * (math.pi / 2) / RECENT
    return math.sqrt(reached + base.error_at(examples) ** 2) / abs(base.q)


def _examples_to(base: BaseLine, loss: float) -> float:
    """The examples at which the base's curve reaches ``loss`` (it falls: q < 0)."""
    return math.exp(min((loss - base.p) / base.q, 700.0))


def _s(n: int) -> str:
    return "" if n == 1 else "s"
