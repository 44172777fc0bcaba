"""One run of benchmarks/autopilot.py: an arm of the protocol trained from a seed.

``train`` runs one arm (a fixed batch, a fixed batch with a linear learning-rate warm-up, the
fastest ramp the autopilot's guards allow, or bsmon's autopilot from the start batch) until
the held-out loss reaches the last target, the examples run out, the loss diverges or the
wall-clock cap is hit. The held-out loss is measured every ``eval_every`` examples under
``torch.no_grad()`` in ``eval()`` mode (bsmon keeps that time out of its step times) and its
time is kept out of the run's wall-clock.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from .tasks import Data, Task, whole_batch

DIVERGED_FACTOR = 3.0  # a held-out loss this many times the initial one: the run diverged


@dataclass(frozen=True)
class Arm:
    """What a run trains with. ``autopilot``: bsmon steers from ``batch`` (the start batch)
    with ``half`` declared as B½ (None: fitted from the job's own step times). ``ramp_to``:
    no monitor; the batch follows ``ramp_size``, the fastest ramp from ``batch`` to this size
    that the autopilot's guards allow, the learning rate moved with it by the autopilot's
    rule for the task's optimizer (linear for SGD, the square root for AdamW). ``adam``: the
    Adam rules at each change (``attach``'s ``adam_moments``, ``adam_beta2`` and
    ``adam_weight_decay``; None: bsmon's defaults), for the autopilot and the ramps alike."""

    batch: int
    lr: float
    warmup_examples: int = 0
    autopilot: bool = False
    half: float | None = None
    ramp_to: int = 0
    noise_budget: float | None = None  # the autopilot's noise-scale budget (None: bsmon's)
    adam: tuple[str, str, str] | None = None
    switch_on: int = 0  # the step the autopilot is switched on at, as ``a`` does (0: attach's)

    @property
    def label(self) -> str:
        rules = "" if self.adam is None else f", adam {'/'.join(self.adam)}"
        if self.autopilot:
            label = "auto, measured B½" if self.half is None else f"auto, B½={self.half:g} declared"
            label += rules
            if self.switch_on:
                label += f", on at step {self.switch_on:,}"
            return label if self.noise_budget is None else f"{label}, noise {self.noise_budget:g}"
        if self.ramp_to:
            return f"fastest ramp to {self.ramp_to}{rules}"
        if self.warmup_examples:
            return f"fixed {self.batch} + warm-up {self.warmup_examples // 1024}k ex"
        return f"fixed {self.batch}"


@dataclass
class RunLog:
    """What one run did. ``evals``: (examples, steps, training wall-clock s, held-out loss),
    the first at step 0; ``sizes``: each step's examples; ``lrs``: each step's learning rate
    (group 0, read before ``optimizer.step()``); ``monitor_sizes``: ``mon.batch_size`` after
    each step (autopilot only). The autopilot's reading at the end: its state, claimed gain,
    B½ and decisions."""

    evals: list[tuple[int, int, float, float]] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    monitor_sizes: list[int] = field(default_factory=list)
    diverged: bool = False
    stopped: str = ""
    claimed_gain: float | None = None  # at the end
    claimed_seen: float | None = None  # the latest claim read at an evaluation or the end
    claimed_note: str | None = None
    state: str | None = None
    why: str | None = None
    half_batch: float | None = None
    half_batch_how: str | None = None
    decisions: list[dict[str, Any]] = field(default_factory=list)
    switched: tuple[int, float] | None = None  # examples and wall-clock s at a late switch-on

    @property
    def examples(self) -> int:
        return sum(self.sizes)

    def first_reach(self, size: int) -> int | None:
        """Examples seen before the first step at a batch of ``size`` or more."""
        seen = 0
        for examples in self.sizes:
            if examples >= size:
                return seen
            seen += examples
        return None


def ramp_size(step: int, start: int, top: int) -> int:
    """The batch of the 0-based ``step`` on the fastest ramp from ``start`` to ``top`` that
    the autopilot's guards allow: ``start`` until its first decision (``WARMUP_STEPS``),
    then twice the size (its most per decision) every ``SETTLE_STEPS`` steps."""
    from bsmon.probes.batch.autopilot import SETTLE_STEPS, WARMUP_STEPS

    if step < WARMUP_STEPS:
        return start
    doublings = 1 + (step - WARMUP_STEPS) // SETTLE_STEPS
    return min(top, start << min(doublings, top.bit_length()))


class RampSampler:
    """Batches of indices in a seeded random order, each step's size from ``ramp_size``; the
    step count carries over from one epoch to the next (an epoch's last batch may be short,
    as a DataLoader's without ``drop_last``)."""

    def __init__(self, length: int, start: int, top: int, generator: torch.Generator) -> None:
        self.length, self.start, self.top, self.generator = length, start, top, generator
        self.steps = 0

    def __iter__(self) -> Iterator[list[int]]:
        order = torch.randperm(self.length, generator=self.generator).tolist()
        at = 0
        while at < self.length:
            size = ramp_size(self.steps, self.start, self.top)
            yield order[at : at + size]
            at += size
            self.steps += 1


ADAM_OPTIONS = ("adam_moments", "adam_beta2", "adam_weight_decay")


class Ramp:
    """The fastest ramp's optimizer: at each size change, the learning rate moved by bsmon's
    rule for it and the Adam rules applied, by bsmon's own functions, as a change the
    autopilot makes would."""

    def __init__(self, optimizer: torch.optim.Optimizer, arm: Arm) -> None:
        from bsmon.probes.batch.adam_rules import AdamRules
        from bsmon.probes.batch.lr_scaling import rule_for

        self.optimizer, self.size = optimizer, arm.batch
        self.rule = rule_for("auto", optimizer)
        self.rules = AdamRules(*arm.adam) if arm.adam is not None else AdamRules()

    def follow(self, size: int) -> None:
        from bsmon.probes.batch.adam_rules import carry_over
        from bsmon.probes.batch.lr_scaling import lr_factor, rescale

        if size == self.size:
            return
        assert self.rule.policy is not None
        factor = lr_factor(self.rule.policy, self.size, size)
        rescale(self.optimizer, factor)
        carry_over(self.optimizer, self.rules, self.size, size, lr_factor=factor, noise_scale=None)
        self.size = size


def train_step(
    task: Task,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    inputs: torch.Tensor,
    labels: torch.Tensor,
) -> torch.Tensor:
    """One optimizer step on a batch, as the arms without a per-step schedule take it; the
    loss, for ``mon.log``."""
    loss = task.loss(model(inputs), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


@torch.no_grad()
def held_out_loss(task: Task, model: nn.Module, data: Data) -> float:
    model.eval()
    inputs, labels = data.held_out
    loss = task.loss(model(inputs), labels).item()
    model.train()
    return loss


def train(
    task: Task,
    arm: Arm,
    seed: int,
    *,
    target: float,
    budget_examples: int,
    max_wall_s: float = 300.0,
) -> RunLog:
    """Train one arm from ``seed`` until the held-out loss is ≤ ``target`` (or the budget,
    a divergence or ``max_wall_s`` of training ends it)."""
    data = task.data()
    torch.manual_seed(seed)
    model = task.model()
    optimizer = task.optimizer(model.parameters(), arm.lr)
    order = torch.Generator().manual_seed(seed)
    mon = None
    if arm.autopilot:
        from bsmon.probes import attach

        mon = attach(
            model,
            optimizer,
            batch_size=arm.batch,
            autopilot=not arm.switch_on,
            autopilot_half_batch=arm.half,
            max_batch_size=task.ceiling,
            record=False,
            serve=False,
            noise_scale="auto",
            name=f"autopilot-{task.name}-{seed}",
            **({} if arm.noise_budget is None else {"noise_budget": arm.noise_budget}),
            **({} if arm.adam is None else dict(zip(ADAM_OPTIONS, arm.adam, strict=True))),
        )
        loader: DataLoader = mon.dataloader(
            data.train, shuffle=True, generator=order, collate_fn=whole_batch
        )
    elif arm.ramp_to:
        sampler = RampSampler(len(data.train), arm.batch, arm.ramp_to, order)  # type: ignore[arg-type]
        loader = DataLoader(data.train, batch_sampler=sampler, collate_fn=whole_batch)
    else:
        loader = DataLoader(
            data.train, batch_size=arm.batch, shuffle=True, generator=order, collate_fn=whole_batch
        )
    log = RunLog()
    first = held_out_loss(task, model, data)
    log.evals.append((0, 0, 0.0, first))
    examples = steps = 0
    wall = 0.0
    next_eval = task.eval_every
    loss_fn = task.loss
    group = optimizer.param_groups[0]
    ramp = Ramp(optimizer, arm) if arm.ramp_to else None
    try:
        resumed = time.perf_counter()
        while not log.stopped:
            for inputs, labels in loader:
                count = len(labels)
                if arm.warmup_examples:
                    group["lr"] = arm.lr * min(1.0, (examples + count) / arm.warmup_examples)
                elif ramp is not None:
                    ramp.follow(ramp_size(steps, arm.batch, arm.ramp_to))
                loss = loss_fn(model(inputs), labels)
                optimizer.zero_grad()
                loss.backward()
                log.lrs.append(float(group["lr"]))
                optimizer.step()
                examples += count
                steps += 1
                log.sizes.append(count)
                if mon is not None:
                    mon.log(loss=loss)
                    log.monitor_sizes.append(int(mon.batch_size or 0))
                    if steps == arm.switch_on:
                        log.switched = examples, wall + time.perf_counter() - resumed
                        mon.job.set_autopilot(True)
                if examples < next_eval:
                    continue
                wall += time.perf_counter() - resumed
                while next_eval <= examples:
                    next_eval += task.eval_every
                value = held_out_loss(task, model, data)
                log.evals.append((examples, steps, wall, value))
                if mon is not None and (reading := mon.job.autopilot_reading()) is not None:
                    log.claimed_seen = reading.claimed_gain or log.claimed_seen
                if not math.isfinite(value) or value > DIVERGED_FACTOR * first:
                    log.diverged, log.stopped = True, "diverged"
                elif value <= target:
                    log.stopped = "target"
                elif examples >= budget_examples:
                    log.stopped = "budget"
                elif wall >= max_wall_s:
                    log.stopped = "wall-clock cap"
                if log.stopped:
                    break
                resumed = time.perf_counter()
    finally:
        if mon is not None:
            _read_autopilot(mon, log)
            mon.close()
    return log


def _read_autopilot(mon: Any, log: RunLog) -> None:
    reading = mon.job.autopilot_reading()
    if reading is None:
        log.state, log.why = "none", "the monitor has no autopilot (no batch size declared?)"
        return
    import msgspec

    log.claimed_gain = reading.claimed_gain
    log.claimed_seen = reading.claimed_gain or log.claimed_seen
    log.claimed_note = reading.claimed_note
    log.state, log.why = reading.state, reading.why
    log.half_batch, log.half_batch_how = reading.half_batch, reading.half_batch_how
    log.decisions = [msgspec.to_builtins(d) for d in reading.decisions]
