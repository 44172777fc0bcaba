"""Batch-size control: requests are checked on the agent thread (or the caller's), and the
switch happens on the training thread at the next step boundary.

A request that passes the policy but is risky (at a size that already ran out of memory,
above the size a probe found to fit, beyond what has been measured to fit, or more than 2×
from the last size that trained well: ``safety``) is refused until it is sent again with
``confirm``. At the switch the learning rate follows the batch (``lr_scaling``). Every switch
is an event; ``watch`` then says what it bought in throughput, once resolved from the noise,
and whether the loss held.

Why one module: a request, its pending switch, the DDP agreement on the step it applies at and
its throughput verdict are one state machine whose transitions share one lock.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil
import torch

from ..runtime.devices import DeviceSample
from ..runtime.distributed import StepSync
from ..runtime.fault_guard import FaultGuard
from ..runtime.hot_path import NEVER
from ..wire.protocol import (
    BatchChange,
    BatchReading,
    BatchSizeResult,
    Event,
    Metrics,
)
from ..wire.routing import CommandRefused
from .adam_rules import AdamRules, carry_over
from .footprint import Footprint
from .lr_scaling import NoFactor, describe, lr_factor, owned_by_scheduler, rescale, rule_for
from .memory_model import MemoryModel
from .policy import BatchPolicy
from .safety import memory_reason, ratio_reason
from .watch import ChangeWatch

BatchCallback = Callable[[int, int], None]


class NeedsConfirmation(CommandRefused):
    """A size that is allowed but risky: the reply asks the user to confirm."""

    def __init__(self, message: str, value: int) -> None:
        super().__init__(f"{message}; send again with confirm to apply it")
        self.result = BatchSizeResult(needs_confirmation=True, value=value, why=message).as_result()


@dataclass(frozen=True)
class Pending:
    value: int
    reason: str
    source: str
    waits_for: str | None = None  # where it is applied, when not at the next step boundary


class BatchController:
    def __init__(
        self,
        *,
        initial: int,
        policy: BatchPolicy,
        micro_batch_size: int | None,
        optimizer: torch.optim.Optimizer,
        lr_scaling: str | None,
        scheduler: Any,
        emit: Callable[[Event], None],
        record: Callable[[BatchChange], None],
        guard: FaultGuard,
        step: Callable[[], int],
        noise_scale: Callable[[], float | None],
        sync: StepSync | None = None,
        rank: int = 0,
        wake: Callable[[], None] = lambda: None,
        footprint: Callable[[], Footprint] | None = None,
        adam_rules: AdamRules | None = None,
    ) -> None:
        """``footprint``: what the job holds whatever its batch (read once, on the agent
        thread, after the first step has made the optimizer's state). ``adam_rules``: what an
        Adam-type optimizer's moments, β2 and weight decay do at a change (adam_rules.py)."""
        self.size = initial
        self.micro = micro_batch_size
        self.policy = policy
        self.last_good = initial
        self.pending: Pending | None = None
        self.arrived: Pending | None = None  # the change that set the current size
        # what the job's loader cannot take (bsmon run --resizable: the script's own loader)
        self.veto: Callable[[int], str | None] | None = None
        # Where a change is applied when not at the next step boundary (an integration whose
        # loader is rebuilt only between epochs): it then calls apply_deferred() there.
        self.apply_at: str | None = None
        self.held: Pending | None = None  # decided (all ranks agree), waiting for apply_deferred
        # Where a change asked now must wait for, when the job's loader cannot take it at the
        # next step boundary (bsmon run --resizable between epochs: the next epoch's start,
        # which calls apply_deferred()); None: it can.
        self.wait_for: Callable[[], str | None] | None = None
        self.probe_max: int | None = None
        self.memory = MemoryModel()
        self.memory_budget: int | None = None
        self.oom_sizes: dict[int, int] = {}  # size -> step it ran out of memory at
        self.watch = ChangeWatch(initial, step)
        self.host_memory = MemoryModel()  # resident memory per size (CPU: no device model)
        self.host_budget: int | None = None
        self.optimizer = optimizer
        self._others: list[torch.optim.Optimizer] = []  # more optimizers the job steps
        self._lr_scaling = lr_scaling
        self.lr_rule = rule_for(lr_scaling, optimizer)
        self.adam_rules = adam_rules or AdamRules()
        self.scheduler = scheduler
        self._emit = emit
        self._record = record
        self._guard = guard
        self._step = step
        self._noise_scale = noise_scale
        self._sync = sync
        self.synced = sync is not None  # the ranks agree at the steps their exchanges end
        self._wake = wake  # asks the training thread for the next step boundary
        self._rank = rank
        self._in_flight: Pending | None = None
        self._callbacks: list[BatchCallback] = []
        self.request_listeners: list[Callable[[Pending], None]] = []  # told after each request
        self._lock = threading.Lock()
        self._switch_time = time.time()
        self._switch_step = 0
        self._sample_seen: DeviceSample | None = None  # the sampler's latest, once observed
        self._footprint = footprint

    # -- sizes ------------------------------------------------------------------------------

    @property
    def loader_size(self) -> int:
        """What each DataLoader batch holds: the micro-batch in accumulation mode."""
        return self.micro if self.micro is not None else self.size

    @property
    def accumulation_steps(self) -> int:
        return self.size // self.micro if self.micro is not None else 1

    def add_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Another optimizer the job steps (a GAN's second one): its learning rate follows
        the batch too, by the rule for its own class, and the loss (the values backward() was
        called on, theirs alternating) is no longer judged after a change (training thread)."""
        if optimizer is not self.optimizer and all(o is not optimizer for o in self._others):
            self._others.append(optimizer)
            self.watch.loss_mixed = True

    def add_callback(self, callback: BatchCallback) -> None:
        if not callable(callback):
            raise TypeError("on_batch_size_change() needs a callable taking (old, new)")
        self._callbacks.append(callback)

    # -- requests (agent thread, or the caller of mon.request_batch_size) -------------------

    def request(self, value: int, *, confirm: bool, reason: str, source: str) -> dict[str, Any]:
        with self._lock:
            if self._rank != 0:
                raise CommandRefused("in a distributed job, send batch-size commands to rank 0")
            if (refusal := self.policy.refusal(value)) is not None:
                raise CommandRefused(refusal)
            if self.veto is not None and (refusal := self.veto(value)) is not None:
                raise CommandRefused(refusal)
            current = self._next_size()
            if value == current:
                raise CommandRefused(f"the batch size is already {value}")
            if not confirm and (why := self.confirmation_reason(value)) is not None:
                raise NeedsConfirmation(why, value)
            later = self.wait_for() if self.wait_for is not None else None
            self.pending = pending = Pending(value, reason or "requested", source, later)
            self._wake()
            step = self._step()
            result = BatchSizeResult(old=self.size, new=value, step=step)
            if self.apply_at is None and later is None:
                result.applies_after_step = self._applies_after(step)
            else:
                result.applies_at = self.apply_at or later
        for listener in self.request_listeners:  # outside the lock: a listener takes its own
            listener(pending)
        return result.as_result()

    @property
    def upcoming(self) -> Pending | None:
        """The change accepted and not yet applied: asked for, carried by the ranks'
        exchange, or held for the integration's point."""
        return self.pending or self._in_flight or self.held

    @property
    def waiting(self) -> bool:
        """Whether the change asked for waits for a point other than the next step boundary."""
        pending = self.pending
        return pending is not None and (self.apply_at is not None or pending.waits_for is not None)

    @property
    def due_at_boundary(self) -> bool:
        """Whether a change asked for is applied at the next step boundary."""
        return self.pending is not None and not self.waiting

    def _next_size(self) -> int:
        """The size the job will have once what is pending or held is applied."""
        upcoming = self.upcoming
        return upcoming.value if upcoming else self.size

    def unapplied(self) -> str | None:
        """At the job's end: a change that was accepted but never applied, because the job
        ended before the step boundary that would have applied it (None: there is none)."""
        upcoming = self.upcoming
        if upcoming is None:
            return None
        where = "the step boundary that would apply it"
        if upcoming.waits_for is not None:
            where = f"the point it waited for: {upcoming.waits_for}"
        return (
            f"the change to batch {upcoming.value} ({upcoming.reason}) was never applied: "
            f"the job ended at step {self._step()}, before {where}; it trained at batch "
            f"{self.size} to the end"
        )

    def _applies_after(self, step: int) -> int:
        """The boundary at which a change asked for now is applied."""
        if self._sync is None:
            return step + 1
        every = self._sync.every
        proposed_at = (step // every + 1) * every  # the next exchange carries it ...
        return proposed_at + every  # ... and the one after applies it everywhere

    def request_step(self, direction: str, *, confirm: bool, source: str) -> dict[str, Any]:
        base = self._next_size()
        value = self.policy.next_size(base, direction)
        if value is None:
            limit = "largest" if direction == "up" else "smallest"
            raise CommandRefused(f"{base} is already the {limit} batch size the policy allows")
        return self.request(value, confirm=confirm, reason=f"step {direction}", source=source)

    def confirmation_reason(self, value: int) -> str | None:
        """Why ``value`` should be confirmed first (None: it is safe to apply)."""
        return self.fit_reason(value) or ratio_reason(value, self.watch.trained_well)

    def fit_reason(self, value: int) -> str | None:
        """Why ``value`` may not fit in memory (None: it is measured or predicted to fit)."""
        ooms = [size for size in self.oom_sizes if size <= value]
        if ooms:
            size = min(ooms)
            return f"batch {size} ran out of memory at step {self.oom_sizes[size]}"
        if self.probe_max is not None and value > self.probe_max:
            return f"{value} is above the largest batch the probe found to fit ({self.probe_max})"
        measured_to_fit = self.probe_max is not None  # and value <= probe_max
        if self.micro is None and not measured_to_fit:  # accumulation: more micro-batches
            why = memory_reason(
                value,
                self.size,
                device=self.memory,
                device_budget=self.memory_budget,
                host=self.host_memory,
                host_budget=self.host_budget,
            )
            if why is not None:
                return why
        return None

    def memory_ceiling(self) -> tuple[int | None, str | None]:
        """The largest size known to fit, and what says so (None: nothing known yet)."""
        if self.oom_sizes:
            smallest = min(self.oom_sizes)
            return smallest - 1, f"batch {smallest} ran out of memory"
        if self.probe_max is not None:
            return self.probe_max, "the probe"
        predicted = self.memory.predicted_max(self.memory_budget)
        if predicted is not None:
            return predicted, "the memory model's prediction"
        return None, None

    # -- the switch (training thread, at a step boundary) ------------------------------------

    def defer_to(self, where: str) -> None:
        """Apply changes ``where`` (an integration whose loader is rebuilt only there, which
        then calls ``apply_deferred()``), not at the next step boundary."""
        self.apply_at = where

    def at_boundary(self, step: int, _now: float) -> int:
        """The scheduled boundary at the end of ``step``: a change due now is applied; the
        next step whose end needs the boundary (a change's first step: it ends at the last
        good size; the ranks' next exchange, ``SYNC_EVERY`` steps on: the steps between are
        ordinary ones)."""
        self.at_step_boundary(step)
        if self.size != self.last_good:
            return step + 1
        if self._sync is not None:
            return self._sync.next_due(step)
        return step + 1 if self.due_at_boundary else NEVER

    def at_step_boundary(self, step: int | None = None) -> None:
        """The end of ``step`` (by default the job's current step)."""
        self.last_good = self.size
        if self._sync is not None:
            self._exchange(self._step() if step is None else step)
            return
        if self.due_at_boundary:
            pending, self.pending = self.pending, None
            self.switch(pending)  # type: ignore[arg-type]

    def apply_deferred(self) -> None:
        """Apply the change held for ``apply_at`` (training thread; all ranks at one point)."""
        if self._sync is not None:  # only what the ranks agreed on: the same change everywhere
            change, self.held = self.held, None
        else:
            change, self.pending = self.pending, None
        if change is not None:
            self.switch(change)
            self._wake()  # its first step's end: the last good size

    def _exchange(self, step: int) -> None:
        if not self._sync.due(step):  # type: ignore[union-attr]
            return
        proposal = 0
        if self._rank == 0 and self.pending is not None and self._in_flight is None:
            self._in_flight, self.pending = self.pending, None
            proposal = self._in_flight.value
        decided = self._sync.exchange(proposal)  # type: ignore[union-attr]
        if decided:
            chosen = self._in_flight or Pending(decided, "decided on rank 0", "rank 0")
            self._in_flight = None
            change = Pending(decided, chosen.reason, chosen.source)
            if self.apply_at is None:
                self.switch(change)
            else:
                self.held = change

    def switch(self, change: Pending) -> None:
        old, new = self.size, change.value
        if new == old:
            return
        factor, lr_note = self._rescale_lr(old, new)
        carried = self._carry_over(old, new, factor)
        self.size = new
        self.arrived = change
        self._switch_time = time.time()
        self._switch_step = self._step()
        reset_peak_memory()
        record = BatchChange(
            step=self._switch_step,
            t=self._switch_time,
            old=old,
            new=new,
            reason=change.reason,
            source=change.source,
            lr_factor=factor,
            lr_note=lr_note,
            optimizer_note="; ".join(carried) or None,
        )
        self._record(record)
        self._emit(
            Event(
                t=record.t,
                step=record.step,
                kind="batch_size",
                message=f"batch {old} → {new} ({change.reason}, {change.source}); "
                + "; ".join([lr_note, *carried]),
                data={
                    "old": old,
                    "new": new,
                    "lr_factor": factor,
                    "lr": lr_note,
                    **({"optimizer": carried} if carried else {}),
                },
            )
        )
        # after the change's own event: what a callback says of it (the script's DataLoader
        # cutting the new size) follows it in the events, as it does in time
        for callback in self._callbacks:
            try:
                callback(old, new)
            except Exception as exc:
                self._guard.report("an on_batch_size_change callback", exc)

    def shrink_after_oom(self, step: int) -> int | None:
        """The size to fall back to after an OOM at the current size (None: nothing smaller)."""
        failed = self.loader_size
        self.oom_sizes[self.size] = step
        if self.micro is not None:
            smaller = failed // 2
            if smaller < 1 or self.size % smaller:
                return None
            self.micro = smaller  # same effective batch, twice the micro-batches
            return self.size
        fallback = self.last_good if self.last_good < self.size else self.size // 2
        return fallback if fallback >= self.policy.min_size else None

    def _rescale_lr(self, old: int, new: int) -> tuple[float | None, str]:
        """Apply the rule; the factor (None: unchanged) and the words for the event."""
        rule = self.lr_rule
        if rule.policy is None:
            return None, f"lr unchanged ({rule.why})"
        try:
            factor = lr_factor(rule.policy, old, new, self._noise_scale(), rule.adam_like)
        except NoFactor as exc:
            return None, f"lr unchanged ({rule.label}: {exc})"
        changes = rescale(self.optimizer, factor, self.scheduler)
        note = f"{describe(changes)} ({rule.label})"
        if self.scheduler is None and owned_by_scheduler(self.optimizer):
            note += (
                "; a learning-rate scheduler owns the lr and may set it back at its next step "
                "(attach(lr_scheduler=...) lets bsmon scale its base rates)"
            )
        for other in self._others:
            note += f"; {self._rescale_other(other, old, new)}"
        return factor, note

    def _carry_over(self, old: int, new: int, factor: float | None) -> list[str]:
        """The Adam rules (adam_rules.py); what moved, in words."""
        rules, said = self.adam_rules, []
        if self.synced and rules.moments == "rescale":
            # each rank's B_simple is its own: rescaled by it, the ranks' moments, and then
            # their weights, would part
            rules = dataclasses.replace(rules, moments="keep")
            said.append("moments kept (rescaling them by one rank's B_simple would part the ranks)")
        noise = self._noise_scale()
        moved = carry_over(self.optimizer, rules, old, new, lr_factor=factor, noise_scale=noise)
        return moved + said

    def _rescale_other(self, optimizer: torch.optim.Optimizer, old: int, new: int) -> str:
        name = type(optimizer).__name__
        rule = rule_for(self._lr_scaling, optimizer)
        if rule.policy is None:
            return f"the other optimizer ({name}) keeps its lr ({rule.why})"
        try:
            factor = lr_factor(rule.policy, old, new, self._noise_scale(), rule.adam_like)
        except NoFactor as exc:
            return f"the other optimizer ({name}) keeps its lr ({exc})"
        return f"the other optimizer ({name}): {describe(rescale(optimizer, factor))}"

    # -- what changes bought, and the memory model (agent thread) ----------------------------

    @property
    def changes(self) -> deque[BatchChange]:
        return self.watch.changes

    def add_change(self, change: BatchChange) -> None:
        self.watch.add_change(change)

    def observe_metrics(self, metrics: Metrics, nonfinite_loss: bool = False) -> list[Event]:
        """Feed one metrics window; returns the events it completes (a throughput verdict,
        a divergence of the loss after a change, its recovery)."""
        return self.watch.observe(metrics, nonfinite_loss)

    def observe_sample(self, sample: DeviceSample, step: int) -> None:
        """Each new sample once (every tick passes the sampler's latest: reading the host's
        free memory at every tick was the agent's largest fixed cost); one taken before a step
        at the current size ran is not a reading of it."""
        stale = sample.t <= self._switch_time or step <= self._switch_step
        if sample is self._sample_seen or stale:
            return
        self._sample_seen = sample
        peaks = [d.torch_peak_bytes for d in sample.devices if d.torch_peak_bytes]
        if peaks:
            self.memory.observe(self.loader_size, max(peaks), step - self._switch_step)
            self.memory_budget = device_budget(sample)
        elif (rss := sample.host.rss_bytes) is not None:  # the CPU: the process's memory
            self.host_memory.observe(self.loader_size, rss, step - self._switch_step)
            self.host_budget = rss + host_available()
        self._read_footprint(step)

    def _read_footprint(self, step: int) -> None:
        """Once (a failure is the guard's to report, and is not tried again)."""
        read = self._footprint
        if read is None or step < 1:
            return
        self._footprint = None
        self.memory.footprint = self.host_memory.footprint = read()

    @property
    def sampled_since_switch(self) -> bool:
        """Whether a device sample taken at the current size (after its switch) was seen."""
        return self._sample_seen is not None and self._sample_seen.t > self._switch_time

    def reading(self) -> BatchReading:
        next_up = self.policy.next_size(self.size, "up")
        predicted_up = self.memory.predicted_peak(next_up) if next_up and not self.micro else None
        return BatchReading(
            control=True,
            min_size=self.policy.min_size,
            max_size=self.policy.max_size,
            next_up=next_up,
            next_down=self.policy.next_size(self.size, "down"),
            pending=upcoming.value if (upcoming := self.upcoming) else None,
            applies_at=self.apply_at or (upcoming.waits_for if upcoming else None),
            accumulation_steps=self.accumulation_steps if self.micro else None,
            micro_batch_size=self.micro,
            lr_scaling=self._lr_scaling,
            lr_rule=self.lr_rule.label if self.lr_rule.policy else self.lr_rule.why,
            trained_well=self.watch.trained_well,
            memory=self.memory.points(),
            memory_budget_bytes=self.memory_budget,
            predicted_max=self.memory.predicted_max(self.memory_budget),
            predicted_peak_next_up=int(predicted_up) if predicted_up else None,
            probe_max=self.probe_max,
            changes=list(self.changes),
        )


def device_budget(sample: DeviceSample) -> int | None:
    """Memory the job's allocator can use on its fullest device: the total, less what NVML
    sees used outside the allocator (the CUDA context, other processes)."""
    budgets = []
    for device in sample.devices:
        total = device.memory_total_bytes
        if not total:
            continue
        outside = 0
        if device.memory_used_bytes is not None and device.torch_reserved_bytes is not None:
            outside = max(0, device.memory_used_bytes - device.torch_reserved_bytes)
        budgets.append(total - outside)
    return min(budgets) if budgets else None


def host_available() -> int:
    """Memory the host can still give (MemAvailable), 0 when it cannot be read."""
    try:
        return int(psutil.virtual_memory().available)
    except (psutil.Error, OSError):
        return 0


def reset_peak_memory() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for index in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(index)
