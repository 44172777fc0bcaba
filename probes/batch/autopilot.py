"""The autopilot: a batch size that follows the gradient noise scale (agent thread).

At each decision point it predicts, for the sizes within 2× of the current one, the progress
per second they would make (``goodput``: the job's measured step time at each size, fitted by
a line, and the noise scale's efficiency), and asks for the best one when it predicts more
than ``THRESHOLD`` over staying. Growth reads B_simple discounted by half its 95% interval
(``Estimate.for_growth``), shrinking the interval's high end; never below the size the
run started at (early in training an LM's B_simple can read below one sequence). The change
goes through the controller like a key press: at a step boundary, the learning rate moved by
the job's rule (linear for SGD, square root for Adam-type), an event for each.

Guards (docs/autopilot.md has the table): no decision while the estimate is unresolved, in
the first ``WARMUP_STEPS`` steps or within ``SETTLE_STEPS`` of a change; never a size that may
not fit (the controller's ``fit_reason``) or that the policy refuses; a divergence after its
change reverts it and keeps that size out of reach; refused where it cannot own the learning
rate or see the loss; any other batch change pauses it (the user's keys win). A look that
keeps the size names the rule that held it (``Hold``): an event once per change of rule, and a
short form in the reading for the Batch panel.

Where B_simple holds a size just short of paying for the next, it may try the next size
(``autopilot_trial``) and keep it only if the loss measures it paying (``progress``: the
measured signal); a measurement of any change moves the noise scale the advisor steers by.

``claimed_gain`` (``gain_claim``) is its progress per second over the spans it drove, against
a fixed batch of the size it was switched on at, from measured throughput and the noise
scale's efficiency; a run in which it made no decision claims nothing.

Why one module: the decisions, the guards and the reading share one lock and one state (on,
paused, refused; the target, the next look, a size out of reach); the model they use
(``goodput``), the claim (``gain_claim``) and the learning rate's owner are apart already.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable

import msgspec

from ..units import count
from ..wire.protocol import (
    AutopilotDecision,
    AutopilotReading,
    BatchChange,
    Event,
    Metrics,
    NoiseScaleReading,
)
from ..wire.routing import CommandRefused
from .advisor import Advisor
from .autopilot_holds import Hold
from .autopilot_trial import Trial, candidate, outcome
from .control import BatchController, Pending
from .gain_claim import GainLedger
from .goodput import (
    MIN_WINDOWS,
    Estimate,
    StepTimeModel,
    resolved,
    unresolved_reason,
)
from .loss_watch import DIVERGED
from .lr_owner import LearningRateOwner, SchedulerPace
from .lr_scaling import owned_by_scheduler

SOURCE = "autopilot"
WARMUP_STEPS = 50  # steps before the first decision
SETTLE_STEPS = 25  # steps at a size (and MIN_WINDOWS windows) before deciding again
RAMP_STEPS = 40 * SETTLE_STEPS  # after switching on or its own change: looks paced by steps
DECISIONS_KEPT = 50
# holds that steps end, not the noise scale: the last change training well (the 2× rule's
# base, which the loss watch decides in windows: at the agent's own pace of four a second a
# fast job would wait thousands of steps for it)
PACED_HOLDS = ("trained",)
TRIED_HOLDS = ("threshold", "target")  # B_simple's holds, which a trial may overturn
KEYED_ON_STEPS = (
    "would run its schedule faster in examples as the batch grows; the autopilot refuses "
    "rather than change what the schedule means (one stepped once an epoch it follows)"
)


class Autopilot:
    def __init__(
        self,
        controller: BatchController,
        *,
        noise_refusal: Callable[[], str | None],
        emit: Callable[[Event], None],
        step: Callable[[], int],
        declared_half: float | None = None,
        plain_step_s: Callable[[], float | None] = lambda: None,
        epochs: Callable[[], int] = lambda: 0,
        advisor: Advisor | None = None,
    ) -> None:
        """``advisor``: the one answer it acts on (its own, with ``declared_half``, if none)."""
        self._control = controller
        self.advisor = advisor or Advisor(controller, declared_half=declared_half)
        self._plain_step_s = plain_step_s  # an unmeasured step's time: the claim's base
        self._noise_refusal, self._emit, self._step = noise_refusal, emit, step
        self.state = "off"
        self.why: str | None = None
        self.waiting: str | None = None
        self.decisions: deque[AutopilotDecision] = deque(maxlen=DECISIONS_KEPT)
        self.decided = 0  # decisions made (``decisions`` keeps the latest ``DECISIONS_KEPT``)
        self._lock = threading.Lock()
        self._estimate: Estimate | None = None
        self._noise: NoiseScaleReading | None = None  # the latest reading, for why it waits
        self._model: StepTimeModel | None = None
        self._target: int | None = None  # the advisor's, at its last look
        self._hold: Hold | None = None  # why the last look kept the size
        self._said: tuple[str, int] | None = None  # the rule and size its last hold event named
        self._next_step: int | None = None
        self._last_change_step = 0
        self._last_look_step = -SETTLE_STEPS
        self.ramp_until = 0  # before this step a look is wanted as soon as it is due
        self._lr_owner = LearningRateOwner(controller)
        self._epochs = epochs  # training DataLoader iterators begun (the job's epochs)
        self._pace = SchedulerPace(controller.scheduler)
        self._ledger = GainLedger(controller.size)
        self._trial: Trial | None = None  # a size it is trying (``autopilot_trial``)
        self._last_trial: int | None = None  # the job's examples when it last tried one
        self._examples = 0  # the job's, at the latest metrics window
        controller.request_listeners.append(self.on_request)

    # -- switching on and off (agent thread, or the job's thread through the router) ---------

    def refusal(self) -> str | None:
        """Why the autopilot cannot steer this job (None: it can)."""
        control = self._control
        rule = control.lr_rule
        if rule.policy is None:
            return f"the learning rate would not follow the batch ({rule.why})"
        if (why := self._noise_refusal()) is not None:
            return f"it needs the gradient noise scale, which is off ({why})"
        if control.scheduler is None and owned_by_scheduler(control.optimizer):
            return (
                "a learning-rate scheduler bsmon was not given owns the rate, and how often it "
                "steps cannot be seen (attach(lr_scheduler=...) shows it): one keyed on steps "
                f"{KEYED_ON_STEPS}"
            )
        if (pace := self._pace.keyed_on_steps()) is not None:
            return f"a learning-rate scheduler keyed on steps ({pace}) {KEYED_ON_STEPS}"
        if control.watch.loss_mixed:
            return (
                "the job steps two optimizers (a GAN's), so the loss is not one objective and "
                "a divergence after a change could not be seen"
            )
        return None

    def switch(self, on: bool) -> AutopilotReading:
        with self._lock:
            if not on:
                self._stop("off", None)
                self._say("autopilot off", level="info")
                return self._reading()
            if (why := self.refusal()) is not None:
                self._stop("refused", why)
                raise CommandRefused(f"the autopilot cannot steer this job: {why}")
            self.state, self.why = "on", None
            self._hold = self._said = None
            self._ledger.begin(
                self._control.size, self._step(), self._control.watch.progress.stretch
            )
            self.ramp_until = self._step() + RAMP_STEPS
            self._lr_owner.reset()
            self._say(f"autopilot on at batch {self._control.size}", level="info")
            return self._reading()

    def start(self) -> None:
        """``attach(autopilot=True)``: on, or refused with a warning event saying why."""
        try:
            self.switch(True)
        except CommandRefused as exc:
            self._say(str(exc), level="warning")

    # -- the agent thread ---------------------------------------------------------------------

    def on_change(self, change: BatchChange) -> None:
        """A batch change was applied: one from anywhere but the autopilot pauses it."""
        with self._lock:
            self._last_change_step = change.step
            if change.source == SOURCE:
                self.ramp_until = change.step + RAMP_STEPS
        # the OOM guard asks for none; the size it steered to is the one the change left
        self._pause_for(change.new, change.source, change.step, change.old)

    def on_request(self, request: Pending) -> None:
        """A change asked for: one from anywhere but the autopilot pauses it at once (a key
        that undoes its change before a step applied it changes nothing, and still wins)."""
        self._pause_for(request.value, request.source, self._step(), self._control.size)

    def _pause_for(self, size: int, source: str, step: int, left: int) -> None:
        """``left``: the size it steered to, where its span ends."""
        if source == SOURCE:
            return  # its own change (a request of its own is made holding the lock)
        with self._lock:
            if self.state != "on":
                return
            why = (
                f"the batch was set to {size} by {source} at step {step:,}: the user's keys "
                "win (a switches the autopilot on again)"
            )
            self._stop("paused", why, left)
            self._say(f"autopilot paused: {self.why}", level="info")

    def on_metrics(self, metrics: Metrics) -> None:
        """One metrics window: the ledger, the guards, and a decision when one is due."""
        with self._lock:
            self._pace.observe(metrics.step, self._epochs())
            self._examples = metrics.samples or self._examples
            estimate = resolved(metrics.noise)
            self._ledger.add(metrics, estimate and estimate.point, self._plain_step_s())  # off too
            if self.state != "on":
                return
            self._estimate, self._noise = estimate, metrics.noise
            self.advisor.advise(metrics.noise, metrics.step)
            self._revert_a_divergence()
            if self.state == "on" and not self._refused_now():
                self._decide(metrics.step)

    def reading(self) -> AutopilotReading:
        with self._lock:
            return self._reading()

    # -- decisions ----------------------------------------------------------------------------

    def _decide(self, step: int) -> None:
        """Act on the advisor's answer when a look is due: its change, or the rule that holds."""
        advisor = self.advisor
        self._model = advisor.model
        waiting = self._wait_reason(step)
        if waiting is not None:
            self.waiting = waiting
            if self._estimate is None and waiting == unresolved_reason(self._noise):
                self._held_by(Hold("estimate", waiting, "holds: B_simple unknown"))
            return
        advice = advisor.latest
        assert advice is not None and self._estimate is not None and self._model is not None
        self._last_look_step, self._next_step = step, step + SETTLE_STEPS
        self._target = advice.target
        if self._trial is not None and self._judge_trial(self._trial, self._model):
            return
        if advice.action in ("raise", "lower") and advice.gain is not None:
            self._hold = None
            kind = "grow" if advice.action == "raise" else "shrink"
            self._ask(kind, advice.batch_size, advice.gain)
            return
        hold = advisor.hold or Hold(advice.rule, advice.reasons[0], f"holds: {advice.why}")
        if hold.rule in TRIED_HOLDS and self._try_next(step):
            return
        if hold.rule not in PACED_HOLDS:
            self.ramp_until = 0  # holding: looks at the agent's own pace again
        self._held_by(hold)
        self.waiting = hold.text

    def _try_next(self, step: int) -> bool:
        """A trial of the next size, where one is due (``autopilot_trial``)."""
        up = self.advisor.up
        old, model = self._control.size, self._model
        assert model is not None
        size = candidate(
            up,
            self._control.watch.progress,
            self._examples,
            self._last_trial,
            lambda size: model.speed_ratio(size, old),
        )
        if size is None:
            return False
        why = (
            f"trial: B_simple predicts {up[1]:.2f}×; {size} is kept only if the loss shows it "
            f"paying against {old}'s own curve"
        )
        if not self._ask("grow", size, up[1], note=why):
            return False
        self._hold = None
        self._trial, self._last_trial = Trial(old, size, step, self._examples), self._examples
        return True

    def _judge_trial(self, trial: Trial, model: StepTimeModel) -> bool:
        """A trial under way: True while it decides the look (measuring, or going back)."""
        if self._control.size != trial.new:
            self._trial = None  # it ended otherwise: a revert, a key
            return False
        found = outcome(trial, self._control.watch.progress, model)
        if found is None:
            self.waiting = f"trying {trial.new}: measuring its progress per example"
            return True
        self._trial = None
        if found.pays:
            self._say(f"autopilot: trial of {trial.new}: {found.text}", level="info")
            return False  # the advisor goes on, with the floor the loss showed
        self._ask("shrink", trial.old, 1 / found.gain, note=f"trial of {trial.new}: {found.text}")
        return True

    def _held_by(self, hold: Hold) -> None:
        """The look kept the size: an event when its rule (or the size) is new."""
        self._hold = hold
        said = (hold.rule, self._control.size)
        if said != self._said:
            self._said = said
            self._say(f"autopilot {hold.text}", level="info", extra={"held": hold.short})

    def _wait_reason(self, step: int) -> str | None:
        control = self._control
        if control.upcoming is not None:
            return f"waiting for the change to {control.upcoming.value} to be applied"
        due = max(
            WARMUP_STEPS, self._last_change_step + SETTLE_STEPS, self._last_look_step + SETTLE_STEPS
        )
        self._next_step = due
        if step < due:
            held = f"{self._hold.text}; " if self._hold else ""
            return f"{held}next decision at step {due:,}"
        self._next_step = None  # due, but what it waits for has no step of its own
        if (unknown := self._pace.unknown()) is not None:
            return unknown
        windows = control.watch.sizes.get(control.size)
        if windows is None or windows.windows < MIN_WINDOWS:
            return f"measuring the step time at batch {control.size}"
        if not control.sampled_since_switch:
            return f"reading the memory at batch {control.size}"
        if self._estimate is None:
            return unresolved_reason(self._noise)
        return None

    def _ask(self, kind: str, size: int, gain: float, note: str = "") -> bool:
        """Ask for ``size`` (``note``: what the decision is, where not the advisor's goodput);
        False: refused."""
        control, step, old = self._control, self._step(), self._control.size
        estimate, model = self._estimate, self._model
        assert estimate is not None and model is not None
        half = model.half_batch
        predicted = f"{gain:.2f}× progress per second predicted"
        reason = note or f"{kind} toward {self._target:,}: {predicted}"
        price = model.price(size, old)
        if price is not None:
            reason += f" ({price})"
        try:
            control.request(size, confirm=True, reason=reason, source=SOURCE)
        except CommandRefused as exc:
            self.waiting = f"the change to {size} was refused: {exc}"
            return False
        self._record(
            AutopilotDecision(
                step=step,
                t=time.time(),
                old=old,
                new=size,
                kind=kind,  # type: ignore[arg-type]
                b_simple=estimate.point,
                b_simple_low=estimate.low,
                b_simple_high=estimate.high,
                half_batch=half if math.isfinite(half) else None,
                target=self._target,
                predicted_gain=gain,
                note="; ".join(filter(None, (note, price))),
            )
        )
        self.waiting = f"asked for {size} at step {step:,}"
        return True

    def _record(self, decision: AutopilotDecision) -> None:
        self.decisions.append(decision)
        self.decided += 1
        self._ledger.decided()
        self._said = None  # a hold after it is news
        claimed = self._ledger.claim()[0]
        so_far = f"; {claimed:.2f}× vs batch {self._base()} so far" if claimed else ""
        if decision.kind == "revert":
            text = f"autopilot: batch {decision.old} → {decision.new} at step {decision.step:,}"
            text += f" ({decision.note})"
        else:
            text = (
                f"autopilot: batch {decision.old} → {decision.new} at step {decision.step:,} "
                f"(B_simple {count(decision.b_simple)} [{count(decision.b_simple_low)}, "
                f"{count(decision.b_simple_high)}], B½ {_half_text(decision.half_batch)}, target "
                f"{decision.target}; {decision.predicted_gain:.2f}× progress per second "
                f"predicted{so_far})"
            )
            if decision.note:  # the re-gather's price, when it grew by accumulation sharded
                text += f"; {decision.note}"
        data = {"decision": msgspec.to_builtins(decision), "claimed_gain": claimed}
        self._emit(
            Event(t=decision.t, step=decision.step, kind="autopilot", message=text, data=data)
        )

    # -- guards -------------------------------------------------------------------------------

    def _revert_a_divergence(self) -> None:
        """The loss diverged after the autopilot's latest change: go back, and stay below."""
        latest = self._control.watch.latest
        if latest is None or latest.source != SOURCE or latest.loss != DIVERGED:
            return
        if self._control.upcoming is not None:
            return  # the revert asked for already (or a change the user asked for) comes first
        note = (
            f"the loss diverged after batch {latest.old} → {latest.new} at step "
            f"{latest.step:,}: back to {latest.old}"
        )
        if latest.new > latest.old:
            note += f", and {latest.new} and above stay out of reach"
        try:
            self._control.request(latest.old, confirm=True, reason=note, source=SOURCE)
        except CommandRefused as exc:
            self._stop("paused", f"{note}, but the revert was refused: {exc}")
            self._say(f"autopilot paused: {self.why}", level="warning")
            return
        self._record(
            AutopilotDecision(
                step=self._step(),
                t=time.time(),
                old=latest.new,
                new=latest.old,
                kind="revert",
                note=note,
            )
        )

    def _refused_now(self) -> bool:
        """What the job did since it was switched on rules it out (a scheduler made later, a
        second optimizer, the job moving the rate itself): it stops, saying why."""
        why = self.refusal()
        if why is None and (moved := self._lr_owner.moved_by_the_job()) is not None:
            why = (
                f"the learning rate moves under the job's own schedule ({moved}): growing the "
                "batch would leave that schedule keyed on steps"
            )
        if why is None:
            return False
        self._stop("refused", why)
        self._say(f"autopilot off: {why}", level="warning")
        return True

    def _stop(self, state: str, why: str | None, left: int | None = None) -> None:
        """It stops steering (``left``: the size it steered to, if not the job's now)."""
        self.state, self.why = state, why
        self._ledger.end(left if left is not None else self._control.size)

    def _base(self) -> int:
        """The size it was last switched on at: its claim's base (the job's now, before)."""
        spans = self._ledger.spans
        return spans[-1].base if spans else self._control.size

    def finish(self) -> None:
        """At the job's end, once it was ever on: where it took the batch in the spans it
        drove, and its claim; with no decision, what held it."""
        with self._lock:
            spans = self._ledger.spans
            if self.state == "off" and not spans:
                return
            claimed, note = self._ledger.claim()
            said = f"{claimed:.2f}× claimed {note}" if claimed is not None else f"no claim: {note}"
            if not self.decided and (held := self._held_at_the_end()) is not None:
                said = f"{held}; {said}"
            size = self._control.size
            drove = ", then ".join(span.text(size) for span in spans) or "it never steered"
            self._say(
                f"autopilot at the end: batch {drove}; {said}",
                level="info",
                extra={"end": True, "claimed_gain": claimed},
            )

    def _held_at_the_end(self) -> str | None:
        """What kept a run that is on from its first decision: B_simple, if it never
        resolved (the reason that matters in a job too short to reach a look, too), else
        the rule that held it at its last look, or what it waited for last."""
        if self.state != "on":
            return None
        if self._estimate is None:
            return unresolved_reason(self._noise)
        return self._hold.text if self._hold is not None else self.waiting

    # -- reading --------------------------------------------------------------------------------

    def _reading(self) -> AutopilotReading:
        estimate, model = self._estimate, self._model
        claimed, note = self._ledger.claim()
        ceiling, ceiling_why = self._control.memory_ceiling()
        half = model.half_batch if model is not None else None
        return AutopilotReading(
            state=self.state,  # type: ignore[arg-type]
            why=self.why,
            waiting=self.waiting if self.state == "on" else None,
            held=self._hold.short if self._hold is not None and self.state == "on" else None,
            start_size=self._base(),
            size=self._control.size,
            b_simple=estimate.point if estimate else None,
            b_simple_low=estimate.low if estimate else None,
            b_simple_high=estimate.high if estimate else None,
            half_batch=half if half is not None and math.isfinite(half) else None,
            half_batch_how=model.how if model is not None else None,
            target=self._target,
            ceiling=ceiling,
            ceiling_why=ceiling_why,
            next_decision_step=self._next_step if self.state == "on" else None,
            claimed_gain=claimed,
            claimed_note=note,
            decisions=list(self.decisions),
        )

    def _say(self, message: str, *, level: str, extra: dict[str, object] | None = None) -> None:
        """An ``autopilot_state`` event; ``extra``: the final claim's fields, at the job's end,
        or the short form of a hold."""
        data = {"state": self.state, "why": self.why, "start_size": self._base(), **(extra or {})}
        self._emit(
            Event(
                t=time.time(),
                step=self._step(),
                kind="autopilot_state",
                level=level,  # type: ignore[arg-type]
                message=message,
                data=data,
            )
        )


def _half_text(half: float | None) -> str:
    if half is None or not math.isfinite(half):
        return "unbounded"
    return count(half)
