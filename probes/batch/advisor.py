"""The one answer to "which batch size?" (agent thread): the advisor.

It joins, once per metrics window, what bsmon knows about the job:

- **memory**: the sizes measured or predicted to fit (an OOM, the probe, the memory model:
  ``BatchController.fit_reason``); a size that may not fit is never advised;
- **step time** ``t(B)``, measured at the sizes the job ran (``goodput.fit_step_time``), its
  shape from the probe's step times while the job has run one size; for a sharded job that
  grows by accumulation, the re-gather of its parameters in each micro-batch more
  (``regather``), a price its reasons state;
- **efficiency** from the noise scale B_simple with its 95% interval: growth reads the
  interval's cautious side, shrinking the other (``Estimate.for_growth``, ``Estimate.high``);
- **the guards**: one change goes at most 2× from the last size that trained well (the rule
  by which ``+`` asks first), never below the size the run started at (early in training an
  LM's B_simple reads below one sequence), never into a size whose loss diverged, never to a
  size the batch policy refuses; a loss that diverged after the latest change says "back".

Its answer, ``Advice``: the size to run now (``raise``/``lower`` when the best size one change
can reach predicts more than ``THRESHOLD``× the progress per second of staying; else
``stay``; ``wait`` while B_simple or the step time is not measured), the reasons with the one
that decided first, a confidence, and what would change it. The autopilot acts on it, the
probe's result is it, the panels and the summary show it: nothing else decides.
"""

from __future__ import annotations

import math
import threading

from ..units import count, duration
from ..wire.describe import noise_verdict, step_batch
from ..wire.protocol import Advice, BatchChange, Confidence, NoiseScaleReading
from .autopilot_holds import THRESHOLD, Hold, candidates, hold_for, measuring_back
from .control import BatchController
from .goodput import (
    Estimate,
    StepTimeModel,
    break_even,
    efficiency_ratio,
    fit_step_time,
    optimum,
    probe_half_batch,
    resolved,
    unresolved_reason,
)
from .loss_watch import DIVERGED
from .progress import ProgressMeter, bounds_text
from .regather import RegatherCost
from .safety import ratio_reason

NARROW = 2.0  # an interval whose ends are within this ratio: B_simple is well measured
WIDE = 4.0  # beyond this ratio: the estimate steers, but loosely


class Advisor:
    """One recommendation per metrics window, from the controller's measurements and the
    latest noise reading; ``latest`` is the last one made."""

    def __init__(
        self,
        controller: BatchController,
        *,
        declared_half: float | None = None,
        regather: RegatherCost | None = None,
    ) -> None:
        self._control = controller
        self._declared_half = declared_half
        self.regather = regather
        self.start_size = controller.size  # the run's: never below it
        self.out_of_reach: int | None = None  # a size whose loss diverged, and all above
        self.latest: Advice | None = None
        self.model: StepTimeModel | None = None
        self.hold: Hold | None = None  # the rule that kept the size, when it stays
        self.up: tuple[int | None, float] = (None, 0.0)  # the best size up, and its gain
        self._noise = NoiseScaleReading()
        self._probe_half: float | None = None
        self._lock = threading.Lock()

    def learn_probe(self, points: list[tuple[int, float]]) -> None:
        """The probe's (batch size, step time) readings: the step time's shape until the job
        itself has run two sizes."""
        with self._lock:
            self._probe_half = probe_half_batch(points)

    def advise(self, noise: NoiseScaleReading | None = None, step: int | None = None) -> Advice:
        """The advice now, from ``noise`` at ``step`` (None: the last reading seen, at the last
        step; a probe's result, between metrics windows)."""
        with self._lock:
            if noise is not None:
                self._noise = noise
            if step is None:
                step = self.latest.step if self.latest is not None else 0
            self.latest = self._advise(step)
            return self.latest

    # -- the decision -------------------------------------------------------------------------

    def _advise(self, step: int) -> Advice:
        control = self._control
        current = control.size
        self._note_divergence(control.watch.latest)
        estimate = resolved(self._noise)
        model = fit_step_time(control.watch.sizes, self._declared_half, self._probe_half)
        if model is not None and self.regather is not None:
            model = model.with_regather(self.regather.at(current))
        self.model = model
        self.hold = None
        self.up = (None, 0.0)
        memory = self._memory_reason()
        if (back := self._back(current, step, memory)) is not None:
            return back
        if estimate is None:
            why = unresolved_reason(self._noise)
            return self._waiting(current, step, ("estimate", why, "B_simple unresolved"), memory)
        if model is None:
            why = f"measuring the step time at batch {current}"
            return self._waiting(current, step, ("measuring", why, "measuring step time"), memory)
        return self._weigh(current, step, estimate, model, memory)

    def _weigh(
        self,
        current: int,
        step: int,
        estimate: Estimate,
        model: StepTimeModel,
        memory: str | None,
    ) -> Advice:
        """Goodput at each size one change may reach, against staying."""
        half = model.half_batch
        meter = self._control.watch.progress
        grown_on = measured_within(estimate.for_growth, meter)
        shrunk_on = measured_within(estimate.high, meter)
        wanted = optimum(grown_on, half)
        target = self._clamp(wanted)
        up_sizes, up_stop = self._walk(current, "up")
        down_sizes, down_stop = self._walk(current, "down")
        up = self.up = self._best(up_sizes, current, grown_on, model)
        if math.isinf(wanted) and up[0] is not None:
            target = max(target, up[0])  # as large as fits: at least the next size
        down = self._best(down_sizes, current, shrunk_on, model)
        up, up_stop = self._unless_measuring(current, up, up_stop)
        down, down_stop = self._unless_measuring(current, down, down_stop)
        facts = [
            self._noise_fact(current, estimate),
            measured_fact(meter),
            step_time_fact(model),
            memory,
        ]
        for action, (size, gain) in (("raise", up), ("lower", down)):
            if size is not None and gain > THRESHOLD:
                deciding = (
                    f"goodput: {size:,} predicts {gain:.2f}× the progress per second of "
                    f"{current:,} (a change needs {THRESHOLD:g}×)"
                )
                read, steered_on = (
                    (estimate.for_growth, grown_on)
                    if action == "raise"
                    else (estimate.high, shrunk_on)
                )
                if steered_on != read:
                    deciding += (
                        f", on the noise scale the loss measured ({phi_text(steered_on)}), "
                        f"not B_simple's {count(read)}"
                    )
                if target != size and (target > size) == (action == "raise"):
                    deciding += f"; heading toward {target:,}, one change at a time"
                if (price := model.price(size, current)) is not None:
                    deciding += f"; {price}"
                edge = _break_even(size, current, model)
                side = "below" if action == "raise" else "above"
                change = f"B_simple {side} ≈ {count(edge)}" if edge else "a new step-time reading"
                return Advice(
                    batch_size=size,
                    current=current,
                    action=action,  # type: ignore[arg-type]
                    rule="goodput",
                    reasons=[deciding, *filter(None, facts)],
                    confidence=confidence(estimate, model),
                    would_change=f"{change} (B_simple ≈ {count(estimate.point)} now), "
                    f"or {size:,}'s measured step time",
                    target=target,
                    gain=gain,
                    headline=f"{action} → {size:,}",
                    why=f"{gain:.2f}× progress/s",
                    step=step,
                )
        if abs(wanted - current) < 0.5:
            hold = Hold("target", f"holding at {current:,}: its target", "holds: at its target")
        elif wanted > current:
            hold = hold_for(current, up, up_stop, model)
        else:
            hold = hold_for(current, down, down_stop, model)
        self.hold = hold
        return Advice(
            batch_size=current,
            current=current,
            action="stay",
            rule=hold.rule,
            reasons=[hold.text, *filter(None, facts)],
            confidence=confidence(estimate, model),
            would_change=self._what_would_move(current, up, down, model, estimate),
            target=target,
            headline=f"stay at {current:,}",
            why=hold.short.removeprefix("holds: "),
            step=step,
        )

    def _unless_measuring(
        self, current: int, best: tuple[int | None, float], stop: Hold | None
    ) -> tuple[tuple[int | None, float], Hold | None]:
        """``best`` and the walk's ``stop``, or no size and the hold, where ``best`` pays but
        goes back toward where the latest change came from before the throughput verdict
        could have read the size it went to (``autopilot_holds.measuring_back``)."""
        size, gain = best
        if size is None or gain <= THRESHOLD:
            return best, stop
        if (measuring := measuring_back(self._control, current, size)) is None:
            return best, stop
        return (None, 0.0), measuring

    def _what_would_move(
        self,
        current: int,
        up: tuple[int | None, float],
        down: tuple[int | None, float],
        model: StepTimeModel,
        estimate: Estimate,
    ) -> str:
        said = []
        if up[0] is not None and (edge := _break_even(up[0], current, model)):
            said.append(f"B_simple above ≈ {count(edge)} would make {up[0]:,} pay")
        if down[0] is not None and (edge := _break_even(down[0], current, model)):
            said.append(f"below ≈ {count(edge)}, {down[0]:,}")
        if not said:
            return "a size within one change that fits and is allowed"
        return "; ".join(said) + f" (B_simple ≈ {count(estimate.point)} now)"

    def _back(self, current: int, step: int, memory: str | None) -> Advice | None:
        """The loss diverged after the latest change and has not come back: go back."""
        latest = self._control.watch.latest
        if latest is None or latest.loss != DIVERGED or latest.new != current:
            return None
        return Advice(
            batch_size=latest.old,
            current=current,
            action="back",
            rule="diverged",
            reasons=[
                f"the loss diverged after batch {latest.old:,} → {latest.new:,} at step "
                f"{latest.step:,}: back to {latest.old:,} (if it does not recover, restore a "
                "checkpoint from before that step)",
                *filter(None, [memory]),
            ],
            confidence="high",
            would_change=f"the loss recovering at {current:,} (it is still watched)",
            headline=f"back → {latest.old:,}",
            why=f"loss diverged at {latest.new:,}",
            step=step,
        )

    def _waiting(
        self, current: int, step: int, waits: tuple[str, str, str], memory: str | None
    ) -> Advice:
        """Stay meanwhile; ``waits``: the rule, what it waits for, and that short."""
        rule, why, short = waits
        return Advice(
            batch_size=current,
            current=current,
            action="wait",
            rule=rule,
            reasons=[why, *filter(None, [memory])],
            confidence="low",
            would_change=why.removeprefix("waiting for "),
            headline=f"stay at {current:,}",
            why=short,
            step=step,
        )

    # -- the guards ---------------------------------------------------------------------------

    def _note_divergence(self, latest: BatchChange | None) -> None:
        """A size whose loss diverged after growing to it stays out of reach, with all above."""
        if latest is not None and latest.loss == DIVERGED and latest.new > latest.old:
            self.out_of_reach = min(latest.new, self.out_of_reach or latest.new)

    def _walk(self, current: int, direction: str) -> tuple[list[int], Hold | None]:
        """Sizes one change may reach one way (the walk's guards, and within 2× of the last
        size that trained well: the rule by which ``+`` asks first), and the rule that ended
        the walk (None: none did)."""
        sizes, stop = candidates(
            self._control,
            current,
            direction,
            start_size=self.start_size,
            out_of_reach=self.out_of_reach,
        )
        trained_well = self._control.watch.trained_well
        within = [s for s in sizes if ratio_reason(s, trained_well) is None]
        if sizes and not within:
            why = ratio_reason(sizes[0], trained_well) or ""
            stop = Hold("trained", why, f"holds: 2× from {trained_well}")
        return within, stop

    @staticmethod
    def _best(
        sizes: list[int], current: int, phi: float, model: StepTimeModel
    ) -> tuple[int | None, float]:
        best: tuple[int | None, float] = (None, 0.0)
        for size in sizes:
            gain = model.speed_ratio(size, current) * efficiency_ratio(size, current, phi)
            if gain > best[1]:
                best = (size, gain)
        return best

    def _clamp(self, target: float) -> int:
        """The target within the start size, the policy's maximum, the memory ceiling and a
        diverged size."""
        control = self._control
        reach = self.out_of_reach - 1 if self.out_of_reach is not None else None
        limits = [x for x in (control.policy.max_size, control.memory_ceiling()[0], reach) if x]
        value = min(max(target, self.start_size), min(limits, default=math.inf))
        return int(value) if math.isfinite(value) else control.size

    # -- the facts it states beside the deciding reason ------------------------------------

    def _noise_fact(self, current: int, estimate: Estimate) -> str:
        verdict = noise_verdict(current, estimate.point)
        worth = current / (current + estimate.point)
        ranks = estimate.ranks
        point, low, high = (count(x * ranks) for x in (estimate.point, estimate.low, estimate.high))
        return (
            f"noise scale: B_simple ≈ {point} [{low}, {high}]: a step at "
            f"{step_batch(current, ranks)} is worth {worth:.0%} of a noiseless one ({verdict}, "
            "counting steps alone; the advice weighs step time too)"
        )

    def _memory_reason(self) -> str | None:
        ceiling, why = self._control.memory_ceiling()
        if ceiling is None:
            return None
        return f"memory: up to {ceiling:,} ({why})"


def _break_even(new: int, old: int, model: StepTimeModel) -> float | None:
    return break_even(new, old, model.half_batch, THRESHOLD, model.speed_ratio(new, old))


def measured_within(phi: float, meter: ProgressMeter) -> float:
    """B_simple's reading moved into what the loss measured: up to the floor a change showed
    it above, down to the latest change's upper end (the measured signal decides where the
    two disagree: it saw what the change did)."""
    return min(max(phi, meter.floor), meter.ceiling)


def measured_fact(meter: ProgressMeter) -> str | None:
    """What the loss measured of the latest change, and the floor it keeps (None: nothing)."""
    latest = meter.latest
    said = [f"measured: {latest.text() if latest is not None else meter.why}"]
    if meter.floor > (latest.bounds()[0] if latest is not None else 0.0):
        said.append(
            f"an earlier change showed the noise scale {bounds_text(meter.floor, math.inf)}"
        )
    if latest is None and len(said) == 1 and not meter.changed:
        return None
    return "; ".join(said)


def phi_text(phi: float) -> str:
    return "unbounded" if math.isinf(phi) else count(phi)


def step_time_fact(model: StepTimeModel) -> str:
    half = model.half_batch
    if not math.isfinite(half):
        fact = f"step time: a larger batch costs no more per step ({model.how})"
    else:
        fact = (
            f"step time: throughput is half its limit at B½ ≈ {count(half)} ({model.how}); "
            "past it, a larger batch buys ever less speed"
        )
    if (regather := model.regather) is not None:
        fact += (
            f"; each micro-batch more re-gathers the sharded parameters "
            f"(+{duration(regather.seconds)}, {regather.how})"
        )
    return fact


def confidence(estimate: Estimate, model: StepTimeModel) -> Confidence:
    """High: a narrow interval and a step-time line the job measured at two sizes (or
    declared); medium: a wider interval, or the shape from the probe's step times (measured
    beside the job, sharing its device); low: a wide interval, or a shape assumed from one
    size."""
    spread = estimate.high / estimate.low
    if spread > WIDE or "assumed" in model.how:
        return "low"
    return "high" if spread <= NARROW and "probe" not in model.how else "medium"
