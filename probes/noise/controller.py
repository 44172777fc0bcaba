"""``NoiseScale``: chooses the estimator, runs it on the training thread, smooths on the agent.

Modes (``attach(..., noise_scale=...)``):

``"auto"`` (default)
    one device: per-example norms; switches to ``microbatch`` while the job accumulates
    gradients (2+ backward passes per step, seen on 3 steps in a row) and back when it stops.
    DDP (the wrapped model passed to attach): the comm-hook estimator (``ddp``); if the model
    already had a comm hook before attach, per-example norms. FSDP2 (``fully_shard``: DTensor
    parameters): per-example norms on every rank, |ḡ|² summed over the ranks' shards
    (``sharded``), whatever the job accumulates.
``"per_example"``
    per-example norms of the supported layers (coverage < 100% when others exist).
``"microbatch"``
    micro-batches: the backward passes of an accumulating step, or under DDP the ranks.
``"sequential"``
    consecutive steps (biased; for comparison only).
``None``
    off.

Training thread: the source's hooks, and ``on_step`` at the optimizer's pre-step hook of the
steps it measures (one record appended to a deque); the per-example and DDP sources are not
looked at on the steps between (the hot path asks ``next_measured``; ``arm`` switches the
hooks on at the step before). Agent thread: ``agent_tick`` reads records and smooths them into
``reading``, which ``NoiseExtension.metrics_part`` (``extension``) puts in the metrics message;
``on_durations`` feeds the budget the steps' durations.

Why one module: choosing a source, switching it as the job starts or stops accumulating, and
refusing with a reason all act on the one source in use and the reading shown for it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..runtime.context import JobContext
from ..runtime.distributed import ddp_of, is_deepspeed_engine
from ..runtime.forward_watch import ForwardWatch
from ..runtime.inbox import take_all
from ..runtime.steps import StepRun
from ..runtime.telemetry import Telemetry
from ..wire.protocol import NONE_WILL_COME, Capability, Event, NoiseScaleReading
from . import reasons
from .autograd import ExampleCounter
from .budget import Budget
from .ddp import CommHookTaken, DDPSource
from .growth import describe_growth
from .microbatch import MicrobatchSource
from .per_example import PerExampleSource, batch_norm_coupled
from .scaling import AdamPreconditioner, LossScale
from .sequential import SequentialSource
from .shard_totals import ShardTotals, on_grid
from .shard_totals import store_for as totals_store
from .sharded import PRECONDITIONED, ShardedSource, divide_factor, fsdp1, sharded
from .source import Source
from .step_record import StepRecord, read
from .tracker import UNACCOUNTED, Tracker
from .warmup import LIMIT, WARMUP_RSE, WARMUP_SHARE, WarmUp
from .zero import ZeroLayout, zero_layout

MODES = ("auto", "per_example", "microbatch", "sequential")
SWITCH_AFTER = 3  # steps in a row that show (or stop showing) gradient accumulation
WAITING_CHECK_EVERY = 64  # auto waits for accumulation: the passes of one step in this many
BACKLOG = 8192  # records waiting for the agent thread (it drains them every 0.25 s)
DEFAULT_BUDGET = 0.01  # share of the step time priced for the hooks; measured total ≈ twice that
NO_ESTIMATE = "noise scale: no estimate — "  # an event's prefix: why there is none (yet)
UNMEASURABLE = "unmeasurable"  # reported once: no estimate will come as the job runs
WARMUP_ENDED = "noise scale: no estimate yet — "  # the warm-up ran out of steps before one
WARMING_UP, TRACKING = "warming up", "tracking"
_RESET = object()


def _round_steps(steps: float) -> int:
    """Two significant figures: the horizon is a rough guide, and a steady one reads steady."""
    return int(float(f"{steps:.2g}"))


def _rank_and_world() -> tuple[int, int]:
    dist = torch.distributed
    return dist.get_rank(), dist.get_world_size()


def _world() -> int:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


class NoiseScale:
    def __init__(
        self,
        model: nn.Module | None,
        optimizer: torch.optim.Optimizer,
        *,
        mode: str | None,
        window: int,
        ctx: JobContext,
        grad_scaler: Any = None,
        preconditioned: bool = False,
        budget: float | None = DEFAULT_BUDGET,
        watch: ForwardWatch | None = None,
        examples_hint: Callable[[], int | None] = lambda: None,
        pass_hint: Callable[[], int | None] = lambda: None,
        examples_known: Callable[[], bool] = lambda: False,
        step_time: Callable[[], float | None] = lambda: None,
    ) -> None:
        if mode is not None and mode not in MODES:
            choices = ", ".join(repr(m) for m in (*MODES, None))
            raise ValueError(f"noise_scale must be one of {choices}, got {mode!r}")
        self.mode = mode
        self.window = window
        self._ctx = ctx
        self._guard = ctx.guard
        self._emit_event = ctx.emit
        self._step = ctx.progress
        self._loss_scale = LossScale(grad_scaler)
        self._precond = AdamPreconditioner(optimizer) if preconditioned else None
        self.preconditioned = preconditioned
        if budget is not None and not budget > 0:
            raise ValueError(f"noise_budget must be a positive fraction or None, got {budget!r}")
        self.budget = Budget(budget)
        self._step_time = step_time
        self._last_measured = 0
        self._last_call = 0  # the step of the previous on_step
        self.next_measured = 1  # the next step whose pre-hook calls on_step
        # measured steps: handed over by the training thread (an append is atomic), then kept
        # by the agent's thread until their durations come (a set the training thread added
        # to while the agent iterated it raised: "Set changed size during iteration")
        self._measured_handover: deque[int] = deque(maxlen=BACKLOG)
        self._measured_steps: set[int] = set()
        self.phase = WARMING_UP
        self.warmup = WarmUp(max(WARMUP_SHARE, budget or 0.0))
        self._examples_hint = examples_hint
        self._pass_hint = pass_hint
        self._examples_known = examples_known
        self._watch = watch if watch is not None else ForwardWatch(model, ctx.guard)
        self._model = model
        self._trainable = list(
            {
                id(p): p for g in optimizer.param_groups for p in g["params"] if p.requires_grad
            }.values()
        )
        self._world = _world()
        ddp = ddp_of(model, self._trainable)  # the model, or a DDP inside a framework's wrapper
        self._ddp = ddp if self._world > 1 else None
        self._inner = ddp.module if ddp is not None else model
        self._zero: ZeroLayout | None = None  # a DeepSpeed engine's (more than one rank)
        if self._world > 1 and is_deepspeed_engine(model):
            self._zero = zero_layout(model, optimizer, self._world)
            self._trainable = self._zero.params  # the torch optimizer holds flat partitions
        fsdp2 = self._world > 1 and ddp is None and sharded(self._trainable)
        self._sharded = fsdp2 or self._zero is not None
        self._totals: ShardTotals | None = None  # the sharded estimate's sums across ranks
        self._closing = False
        self._counter: ExampleCounter | None = None
        self._inbox: deque[Any] = deque(maxlen=BACKLOG)
        self._exclusions: deque[tuple[int, ...]] = deque()
        self.tracker = Tracker(window)
        self.source: Source | None = None
        self.why = "turned off: attach(noise_scale=None)"
        self._accumulating_steps = 0
        self._single_steps = 0
        self._single_seen_at = 0  # the step a waiting job was first seen not to accumulate
        self._auto_microbatch = False
        self._per_example_unfit: str | None = None  # why auto never uses per-example norms
        self._reported: set[str] = set()
        self._read_at = 0  # the training step the reading was read at
        self.reading = NoiseScaleReading()
        if mode is not None:
            try:
                self.source, self.why = self._choose(mode)
            except Exception as exc:  # a bsmon bug must not stop the job from starting
                ctx.guard.report("noise scale: setup", exc)
                self.source, self.why = None, f"bsmon could not set it up: {exc}"
        self.reading = self._reading()

    # -- choosing ------------------------------------------------------------------------------

    def _kwargs(self, world: int = 1) -> dict[str, Any]:
        return {
            "guard": self._guard,
            "loss_scale": self._loss_scale,
            "precond": self._precond,
            "emit": self._emit,
            "world": world,
        }

    def _counted(self) -> ExampleCounter:
        if self._counter is None:
            self._counter = ExampleCounter(
                self._watch, "noise scale: examples", self._examples_known
            )
        return self._counter

    def _per_example(self, world: int) -> PerExampleSource | None:
        if self._inner is None or self._watch.wrapper or self._watch.blocked() is not None:
            return None
        source = PerExampleSource(
            self._inner, self._trainable, self._watch, self._pass_hint, **self._kwargs(world)
        )
        if source.coverage > 0:
            return source
        source.close()
        return None

    def _no_per_example(self) -> str:
        """Why per-example norms cannot be had in this job."""
        watch = self._watch
        if watch.wrapper:
            return "the model is compiled (torch.compile): bsmon's hooks cannot see its layers"
        if (reason := watch.blocked()) is not None:
            return f"{reason}: bsmon's hooks would change what it compiles"
        return reasons.no_layers()

    def _microbatch(self) -> MicrobatchSource:
        return MicrobatchSource(
            self._trainable,
            self._counted(),
            self._examples_hint,
            self._pass_hint,
            **self._kwargs(),
        )

    def _choose(self, mode: str) -> tuple[Source | None, str]:
        world = self._world
        if self._sharded:
            return self._choose_sharded(mode)
        if world > 1 and self._ddp is None and fsdp1(self._model):
            return None, reasons.fsdp1()
        if mode == "sequential":
            source = SequentialSource(
                self._trainable,
                self._counted(),
                self._examples_hint,
                **self._kwargs(world),
            )
            return source, "consecutive steps (sequential: biased, for comparison only)"
        if world > 1 and mode in ("auto", "microbatch"):
            if self._ddp is None:
                return None, reasons.not_ddp(world, self._model)
            try:
                source = DDPSource(
                    self._ddp, self._counted(), self._examples_hint, **self._kwargs(world)
                )
                return source, f"local vs all-reduced gradients over {world} ranks (DDP comm hook)"
            except CommHookTaken:
                taken = reasons.comm_hook_taken()
                if mode == "microbatch":
                    return None, taken
                if (coupled := batch_norm_coupled(self._inner)) is not None:
                    return None, f"{taken}; and {coupled}"
                source = self._per_example(world)
                if source is None:
                    return None, f"{taken}; and {self._no_per_example()}"
                return source, f"per-example gradient norms ({taken})"
        if mode in ("auto", "per_example"):
            if world > 1 and self._ddp is None and mode == "per_example":
                return None, reasons.not_ddp(world, self._model)
            if mode == "auto" and (coupled := batch_norm_coupled(self._inner)) is not None:
                return self._fallback_microbatch(coupled)
            source = self._per_example(world)
            if source is not None:
                why = "per-example gradient norms in the backward pass"
                return source, why + (" (auto: one device)" if mode == "auto" else "")
            if mode == "per_example":
                return None, self._no_per_example()
            return self._fallback_microbatch(self._no_per_example())
        return self._microbatch(), "micro-batch norms across the backward passes of each step"

    def _choose_sharded(self, mode: str) -> tuple[Source | None, str]:
        """FSDP2: per-example norms and the shards' sums, or off with the reason (the other
        sources would read DTensor gradients, each read a collective on the training thread)."""
        world = self._world
        if mode not in ("auto", "per_example"):
            return None, reasons.sharded_only_per_example(mode)
        if self.preconditioned:
            return None, f"not supported yet: {PRECONDITIONED}"
        zero = self._zero
        if zero is not None and zero.unsupported is not None:
            return None, zero.unsupported
        if (coupled := batch_norm_coupled(self._inner)) is not None:
            return None, coupled
        if self._inner is None or self._watch.wrapper or self._watch.blocked() is not None:
            return None, self._no_per_example()
        if zero is None:
            layout, where = {"divide": divide_factor(self._inner, world)}, "FSDP2"
        else:
            layout = {"divide": zero.world, "step_part": zero.part}
            where = f"DeepSpeed ZeRO-{zero.stage}"
        source = ShardedSource(
            self._inner,
            self._trainable,
            self._watch,
            self._pass_hint,
            **layout,
            **self._kwargs(world),
        )
        if source.coverage == 0 or (zero is not None and source.coverage < 1):
            source.close()
            if source.coverage > 0:
                return None, reasons.partitions_hold_all(source.coverage)
            return None, self._no_per_example()
        self._totals = ShardTotals(totals_store(), *_rank_and_world())
        return source, (
            f"per-example gradient norms on every rank, |ḡ|² summed over {world} ranks' "
            f"shards ({where})"
        )

    def _fallback_microbatch(self, why: str) -> tuple[Source, str]:
        """auto, where per-example norms do not fit the job (``why``): micro-batches, which
        wait for the job to accumulate gradients."""
        self._auto_microbatch = True
        self._per_example_unfit = why
        return self._microbatch(), f"micro-batch norms (auto: {why}; needs gradient accumulation)"

    # -- training thread -----------------------------------------------------------------------

    def on_step(self) -> None:
        """At the optimizer's pre-step hook (post-step for a step given a closure, whose
        backward pass runs inside it), on the steps ``next_measured`` names (the hot path asks
        only then): hand this step's record to the agent thread and choose the next step."""
        source = self.source
        if source is None:
            return
        try:
            while self._exclusions:
                ids = self._exclusions.popleft()
                if isinstance(source, PerExampleSource):
                    source.exclude_params(ids, UNACCOUNTED)
            step = self._step() + 1
            measured = source.measuring
            if measured:
                self._measured_handover.append(step)
            gap = step - self._last_measured if self._last_measured else 1
            record = source.take_record(step, max(1, gap))
            if record is not None:
                self._last_measured = step
                self._inbox.append(record)
            counts_passes = measured or isinstance(source, MicrobatchSource)
            if self.mode == "auto" and self._ddp is None and not self._sharded and counts_passes:
                self._maybe_switch(source.last_backwards)
            steps = step - self._last_call if self._last_call else 1
            self._last_call = step
            waiting = self._waiting_for_accumulation()
            warming = not waiting and self.phase == WARMING_UP and self.budget.limited
            step_time = self._step_time()
            ahead = self.budget.gap(
                measured, source.take_cost(), step_time, max(1, steps), free=warming
            )
            source = self.source
            if source is None:
                return
            if warming:
                dense = self.warmup.ahead(step, measured, self.budget, step_time, self._precise())
                if dense is None:
                    self.phase = TRACKING
                    self._warmup_ended()
                else:
                    ahead = dense
            totals = self._totals
            if totals is not None:  # every rank measures the same steps
                totals.gap = ahead
                ahead = on_grid(step, max(ahead, totals.agreed))
            if source.skips_unmeasured_steps:
                self.next_measured = step + ahead  # the steps between are not even looked at
            elif (
                waiting
                and self._per_example_unfit
                and isinstance(source, MicrobatchSource)
                and source.last_backwards == 1
            ):
                # auto's micro-batches in a job seen not to accumulate (a step with no pass
                # counted, as bsmon run's first, is no evidence): its passes are counted on
                # one step in WAITING_CHECK_EVERY, the others cost nothing
                self._single_seen_at = self._single_seen_at or step
                self.next_measured = step + WAITING_CHECK_EVERY
                source.set_counting(False)
            else:
                self.next_measured = step + 1  # micro-batches: passes counted every step
            source.set_measuring(ahead == 1 and not waiting)
            if isinstance(source, PerExampleSource) and source.refused:
                self._per_example_refused(source.refused)
        except Exception as exc:
            self._guard.report("noise scale: step", exc)

    def due(self, step: int) -> bool:
        """Whether ``step`` is one whose pre-step hook must call ``on_step``."""
        return self.source is not None and step >= self.next_measured

    def arm(self) -> None:
        """The next step is the one ``next_measured`` names: a source that skips unmeasured
        steps (per-example norms, DDP's comm hook) measures it, a waiting micro-batch source
        counts its passes (training thread). The other sources see every step, and
        ``on_step`` decides."""
        source = self.source
        if source is None:
            return
        if source.skips_unmeasured_steps and not source.measuring:
            source.set_measuring(True)
        elif isinstance(source, MicrobatchSource):
            source.set_counting(True)

    def on_durations(self, run: StepRun) -> None:
        """Steps' durations (agent thread): what measured and other steps take, for the
        budget's price; none while the estimate is off (nothing to price)."""
        measured_steps = self._measured_steps
        if self._measured_handover:
            measured_steps.update(take_all(self._measured_handover))
        if self.source is None and not measured_steps:
            return
        steps, durations = run.steps, run.durations
        measured: list[float] = []
        seen: set[int] = set()
        if measured_steps and min(measured_steps) <= steps[-1]:
            seen = {s for s in measured_steps if s in steps}
            measured = [d for s in sorted(seen) if (d := durations[s - steps.start]) and d > 0]
            measured_steps -= seen
        recent = -2 * Budget.SAMPLES  # the budget keeps the latest plain ones only
        plain = [
            d
            for s, d in zip(steps[recent:], durations[recent:], strict=True)
            if d is not None and d > 0 and s not in seen
        ]
        if len(measured_steps) > BACKLOG:
            measured_steps.clear()  # steps whose durations never came (a reset)
        self.budget.add_durations(measured, plain)

    def _waiting_for_accumulation(self) -> bool:
        """auto fell back to micro-batch norms and the job does not accumulate: measuring a
        single backward pass would cost and show nothing, so only passes are counted."""
        source = self.source
        return (
            self._auto_microbatch
            and isinstance(source, MicrobatchSource)
            and source.last_backwards < 2
        )

    def _warmup_ended(self) -> None:
        """The warm-up ran out of steps before an estimate: say so, with what it measured."""
        if self.warmup.ended == LIMIT and self.reading.b_simple is None:
            self._emit(f"{WARMUP_ENDED}{self.warmup.describe()}; the cost budget alone from now on")

    def _precise(self) -> bool:
        """Whether the estimate has reached the warm-up's precision (±20%): the rule looks at
        the precision reached, never at a step's own gradient."""
        reading = self.reading
        return (
            reading.b_simple is not None
            and reading.stderr is not None
            and reading.stderr <= WARMUP_RSE * reading.b_simple
        )

    def _per_example_refused(self, reason: str) -> None:
        """The forward watch cannot be used (torch.compile came into use): fall back."""
        why = f"{reason}: bsmon's hooks would change what it compiles"
        if self.mode == "auto":
            new, self.why = self._fallback_microbatch(why)
            self._switch(new, why, True, restart_why=False)
        else:
            self.refuse(why)

    def refuse(self, why: str) -> None:
        """Turn the estimate off for good, with the reason shown where it would be."""
        if self.source is None:
            return
        self.source.close()
        self.source = None
        self.why = why
        self._inbox.append(_RESET)
        self._ctx.warn("noise_scale", f"noise scale: off — {why}")

    def _maybe_switch(self, backwards: int) -> None:
        if backwards == 0:
            return
        if backwards > 1:
            self._accumulating_steps += 1
            self._single_steps = 0
        else:
            self._single_steps += 1
            self._accumulating_steps = 0
        source = self.source
        if isinstance(source, PerExampleSource) and self._accumulating_steps >= SWITCH_AFTER:
            self._switch(self._microbatch(), "gradient accumulation", True)
        elif (
            isinstance(source, MicrobatchSource)
            and self._auto_microbatch
            and self._single_steps >= SWITCH_AFTER
            and self._inner is not None
            and self._per_example_unfit is None
        ):
            per_example = self._per_example(1)
            if per_example is not None:
                self._switch(per_example, "no more gradient accumulation", False)

    def _switch(
        self, new: Source, because: str, auto_microbatch: bool, restart_why: bool = True
    ) -> None:
        old = self.source
        if old is not None:
            old.close()
            # an auto fallback to micro-batches waits for accumulation before measuring
            new.set_measuring(old.measuring and not auto_microbatch)
        self.source = new
        self._last_measured = 0
        self.next_measured = 0  # from the next step on, as the new source decides
        self.phase = WARMING_UP
        self.warmup.restart(self._step())
        self._auto_microbatch = auto_microbatch
        self._accumulating_steps = self._single_steps = self._single_seen_at = 0
        if restart_why:
            self.why = (
                "micro-batch norms across the backward passes of each step (auto: gradient "
                "accumulation)"
                if isinstance(new, MicrobatchSource)
                else "per-example gradient norms in the backward pass (auto: one device)"
            )
        self._inbox.append(_RESET)
        self._emit(
            f"noise scale: {because}, now measured with {new.estimator} (estimate restarted)"
        )

    def _emit(self, message: str, level: str = "info") -> None:
        event = Event(time.time(), self._step(), "noise_scale", message, level)  # type: ignore[arg-type]
        self._emit_event(event)

    # -- agent thread --------------------------------------------------------------------------

    def agent_tick(self, telemetry: Telemetry) -> None:
        inbox = self._inbox
        changed = False
        while inbox:
            item = inbox[0]
            if item is _RESET:
                inbox.popleft()
                self.tracker.reset()
                changed = True
                continue
            values = read(item.values)
            if values is None:
                break  # a device copy still in flight; keep the order
            inbox.popleft()
            if self._totals is not None and isinstance(self.source, ShardedSource):
                self._totals.offer(item, values, self.source.signature())
            else:
                self._ingest(item, values, telemetry)
                changed = True
        if self._totals is not None:
            if self._closing:  # the last tick: the last steps' totals, not lost at exit
                self._totals.finish()
            for record, values in self._totals.take():
                self._ingest(record, values, telemetry)
                changed = True
        # an estimate is read at the job's step: unchanged, it still ages (growth.stale)
        aged = self.reading.b_simple is not None and self._step() != self._read_at
        if changed or aged or (self._unmeasurable() and UNMEASURABLE not in self._reported):
            self.reading = self._reading()
            self._report_below_zero(telemetry)
            self._report_unmeasurable(telemetry)

    def _unmeasurable(self) -> str | None:
        """Why no estimate will come while the job runs as it does (auto's micro-batches,
        per-example norms not fitting, and the job seen taking one backward pass a step)."""
        source, unfit = self.source, self._per_example_unfit
        if unfit is None or not isinstance(source, MicrobatchSource):
            return None
        if not self._waiting_for_accumulation() or source.last_backwards != 1:
            return None
        return reasons.needs_accumulation(unfit)

    def _report_unmeasurable(self, telemetry: Telemetry) -> None:
        """Once, as soon as the job is seen not to accumulate: why there is no estimate, as
        a warning the summary keeps."""
        if (why := self._unmeasurable()) is None or UNMEASURABLE in self._reported:
            return
        self._reported.add(UNMEASURABLE)
        message = f"{NO_ESTIMATE}{why}"
        step = self._single_seen_at or self._step()  # when it was seen, not when the agent came
        telemetry.add_event(Event(time.time(), step, "noise_scale", message, "warning"))

    def _report_below_zero(self, telemetry: Telemetry) -> None:
        """Once: enough steps, and |G|² below zero beyond its error (BatchNorm, for
        per-example norms): the reason there is no estimate, as a warning the summary keeps."""
        source, note = self.source, self.reading.note
        if source is None or note is None or note != source.below_zero():
            return
        if NO_ESTIMATE in self._reported:
            return
        self._reported.add(NO_ESTIMATE)
        message = f"{NO_ESTIMATE}{note}"
        telemetry.add_event(Event(time.time(), self._step(), "noise_scale", message, "warning"))

    def _ingest(self, record: StepRecord, values: list[float], telemetry: Telemetry) -> None:
        outcome = self.tracker.add(record, values)
        if outcome.exclude:
            self._exclusions.append(outcome.exclude)
        if outcome.reason and outcome.reason not in self._reported and len(self._reported) < 20:
            self._reported.add(outcome.reason)
            telemetry.add_event(
                Event(
                    t=time.time(),
                    step=record.step,
                    kind="noise_scale",
                    level="warning",
                    message=f"noise scale: skipped step {record.step}: {outcome.reason} "
                    "(further skips are only counted)",
                )
            )

    def _reading(self) -> NoiseScaleReading:
        source = self.source
        if source is None:
            return NoiseScaleReading(note=self.why)
        detail = source.detail() + self._totals_detail()
        phase = None if source.always_measure or not self.budget.limited else self.phase
        waiting = self._waiting_for_accumulation()
        warmup = self.warmup.describe() if phase is not None and not waiting else ""
        detail += f"; {warmup}" if warmup else ""
        if phase == TRACKING:
            detail += f"; tracking: measured on {self.budget.share:.0%} of steps (cost budget)"
            age = self.tracker.averages.mean_age
            if age >= 1:
                detail += f", averaging the last ~{_round_steps(age + 1):,} steps"
        self._read_at = now = self._step()
        reading = self.tracker.reading(
            estimator=source.estimator,
            coverage=source.coverage,
            biased=source.biased,
            preconditioned=self.preconditioned,
            detail=detail,
            negative=source.below_zero(),
            now=now,
        )
        if (growth := self.tracker.growth_applied) is not None and growth.factor != 1.0:
            reading.detail = f"{reading.detail}; {describe_growth(growth)}"
        reading.phase = phase
        reading.status = self._status(reading)
        reading.ranks = self._world
        return reading

    def _totals_detail(self) -> str:
        """What the exchange of the sharded estimate's sums has to say, if anything."""
        totals = self._totals
        if totals is None:
            return ""
        if totals.failure is not None:
            return f"; the ranks' sums stopped coming ({totals.failure})"
        if totals.unmatched:
            return f"; {totals.unmatched} measured steps left out: not every rank measured them"
        return ""

    def _status(self, reading: NoiseScaleReading) -> str | None:
        """What the estimate is doing while it has no number, in words the panel shows."""
        if (why := self._unmeasurable()) is not None:
            return f"{NONE_WILL_COME}{why}"
        if reading.b_simple is not None or reading.lower_bound is not None:
            return None
        if not reading.needed or reading.effective >= reading.needed:
            return None
        status = f"collecting {reading.effective:.0f}/{reading.needed} measured steps"
        share = self.budget.share
        if reading.phase == TRACKING and self.warmup.ended == LIMIT and 0 < share < 1:
            status += (
                "; the warm-up's allowance is spent: measuring about 1 step in "
                f"{round(1 / share):,} now (the cost budget)"
            )
        return status

    # -- either thread -------------------------------------------------------------------------

    @property
    def capability(self) -> Capability:
        if self.source is None:
            return Capability(False, self.why)
        extra = " (Adam-preconditioned)" if self.preconditioned else ""
        return Capability(True, self.why + extra)

    def close(self) -> None:
        """The hooks out (closing thread); the ranks' exchange goes on until the agent's last
        tick ``finish``es it (its thread is a daemon: nothing waits on it if none comes)."""
        if self.source is not None:
            self.source.close()
        self._closing = True
        if self._counter is not None:
            self._counter.remove()
