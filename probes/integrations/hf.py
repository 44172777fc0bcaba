"""bsmon for the Hugging Face Trainer: ``Trainer(..., callbacks=[BsmonCallback()])``.

Telemetry (steps, step time, the samples each step's forward passes take, the model's loss,
the Trainer's ``grad_norm`` and ``learning_rate`` logs), the noise scale and everything else
a ``Monitor`` does, plus batch-size control through the Trainer's train DataLoader.

What control can and cannot do (the Trainer builds its DataLoader once, and counts the
optimizer steps of an epoch from its starting batch size):

- The batch size shown and changed is ``per_device_train_batch_size``, what one forward pass
  takes (with ``gradient_accumulation_steps=k`` each optimizer step takes k of them).
- A change applies mid-epoch: the DataLoader's batch sampler is made to read its batch size
  before cutting each batch. accelerate's DataLoader reads one batch ahead, so the first
  batch at the new size is that of the second step after the switch.
- Sizes below the starting size are refused: the Trainer would end each epoch after the
  number of steps it computed at the start, before the data ran out. Larger sizes end the
  epoch in fewer steps (the remaining step slots of the epoch pass without data).
- The learning-rate schedule and ``max_steps`` stay as the Trainer computed them: with
  ``max_steps`` the run takes that many optimizer steps (more samples at a larger batch);
  with epochs it ends when they are done (fewer steps, the schedule unfinished).
- Single process only: under torchrun, accelerate shards the batches across ranks and the
  Trainer's DataLoader cannot be resized consistently; telemetry still works on every rank.
- The Trainer's arguments are not changed: a run resumed from a checkpoint starts again at
  ``per_device_train_batch_size``.

Import errors name the extra to install (``pip install 'bsmon[hf]'``). See
docs/integrations.md.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler

from ..batch.loader import batch_length
from ..runtime.losses import loss_of
from .common import disable_batch_control, guarded, note, rank_name, require

transformers = require("transformers", "hf", "transformers")
TrainerCallback = transformers.TrainerCallback

FORWARDED_LOGS = ("grad_norm", "learning_rate")
MIN_REASON = (
    "the Trainer fixed the number of steps in an epoch at its starting batch size; "
    "a smaller batch would end every epoch before its data"
)


class ResizableBatchSampler(BatchSampler):
    """torch's ``BatchSampler``, reading ``batch_size`` before it cuts each batch (torch's
    own may read it once per epoch), so a new size applies at the next batch."""

    def __iter__(self) -> Iterator[list[int]]:
        indices = iter(self.sampler)
        while True:
            size = self.batch_size
            batch = list(itertools.islice(indices, size))
            if not batch or (self.drop_last and len(batch) < size):
                return
            yield batch

    def __len__(self) -> int:
        total = len(self.sampler)  # type: ignore[arg-type]
        return total // self.batch_size if self.drop_last else math.ceil(total / self.batch_size)


def unwrap_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside accelerate's ``AcceleratedOptimizer`` (and the like)."""
    seen = 0
    while seen < 8 and isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
        optimizer, seen = optimizer.optimizer, seen + 1
    return optimizer


def resizable_sampler(loader: Any) -> tuple[BatchSampler | None, str]:
    """The batch sampler bsmon can resize in ``loader``, or None and why not."""
    sampler = getattr(loader, "batch_sampler", None)
    if type(sampler) not in (BatchSampler, ResizableBatchSampler):
        kind = type(sampler).__name__ if sampler is not None else "no batch sampler"
        return None, (
            f"the Trainer's train DataLoader has {kind}, not torch's BatchSampler "
            "(an IterableDataset, or batches sharded across processes); bsmon cannot resize it"
        )
    if not isinstance(sampler.batch_size, int) or sampler.batch_size < 1:
        return None, "the Trainer's train DataLoader has no batch size"
    return sampler, ""


class BsmonCallback(TrainerCallback):
    """Attach bsmon to a Hugging Face Trainer run (see the module's documentation)."""

    def __init__(self, name: str | None = None, **attach_options: Any) -> None:
        """``name``: the job's name (default: the script's); other keywords go to ``attach``
        (``max_batch_size``, ``batch_step``, ``lr_scaling``, ``noise_scale``, ...)."""
        self.name = name
        self.attach_options = attach_options
        self.monitor: Any = None
        self._hooks: list[Any] = []
        self._model_loss = False  # the model's forward returns the loss: on_log's is not needed

    # -- lifecycle ------------------------------------------------------------------------------

    def on_train_begin(
        self,
        args: Any,
        state: Any,
        control: Any,
        *,
        model: Any = None,
        optimizer: Any = None,
        lr_scheduler: Any = None,
        train_dataloader: Any = None,
        **_kwargs: Any,
    ) -> None:
        from ..agent import attach
        from ..runtime.session import default_name

        if self.monitor is not None:
            self._close("a new train() began")
        optimizer = unwrap_optimizer(optimizer)
        if not isinstance(optimizer, torch.optim.Optimizer):
            return  # e.g. DeepSpeed's own optimizer: nothing to hook
        sampler, why_not = resizable_sampler(train_dataloader)
        if args.world_size > 1:
            sampler, why_not = (
                None,
                (
                    f"the Trainer runs {args.world_size} processes: accelerate shards its batches "
                    "across ranks and bsmon resizes single-process runs only"
                ),
            )
        options = dict(self.attach_options)
        if options.get("lr_scaling", "auto") and "lr_scheduler" not in options:
            options["lr_scheduler"] = lr_scheduler
        start = sampler.batch_size if sampler is not None else None
        if start is not None:
            options["min_batch_size"] = max(start, options.get("min_batch_size", 1))
        name = rank_name(self.name or default_name(), args.process_index, args.world_size)
        self.monitor = attach(model, optimizer, name=name, batch_size=start, **options)
        if sampler is None:
            disable_batch_control(self.monitor, why_not)
        else:
            self._make_resizable(sampler)
        if isinstance(model, torch.nn.Module):
            self._hooks = [
                model.register_forward_pre_hook(self._before_forward, with_kwargs=True),
                model.register_forward_hook(self._after_forward, with_kwargs=True),
            ]

    def _make_resizable(self, sampler: BatchSampler) -> None:
        control = self.monitor.job.batch_control
        if control.policy.min_size == sampler.batch_size:
            control.policy = dataclasses.replace(control.policy, min_reason=MIN_REASON)
        sampler.__class__ = ResizableBatchSampler  # same object and state; reads its size per batch

        def resize(_old: int, new: int) -> None:
            sampler.batch_size = new

        self.monitor.on_batch_size_change(resize)
        note(
            self.monitor,
            "integration",
            f"batch-size control: from {sampler.batch_size} up, applied from the second step "
            "after a change (the Trainer's DataLoader reads one batch ahead)",
        )

    def on_train_end(self, args: Any, state: Any, control: Any, **_kwargs: Any) -> None:
        self._close("train() ended")

    def _close(self, reason: str) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        if self.monitor is not None:
            self.monitor.close(reason)
            self.monitor = None

    # -- training thread ---------------------------------------------------------------------

    @guarded
    def _before_forward(self, module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        if module.training and self.monitor is not None:
            n = batch_length(args) or batch_length(kwargs)
            if n is not None:
                self.monitor.job.count_samples(n, n)
                if kwargs and not args:  # what the probe grows: the Trainer's model(**inputs)
                    self.monitor.job.probe_source.offer(kwargs, n)

    @guarded
    def _after_forward(self, module: torch.nn.Module, _args: Any, _kw: Any, output: Any) -> None:
        if module.training and self.monitor is not None:
            loss = loss_of(output)
            if loss is not None:
                self._model_loss = True
                self.monitor.log(loss=loss)

    @guarded
    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **_kwargs: Any) -> None:
        if self.monitor is None or not logs:
            return
        names = FORWARDED_LOGS if self._model_loss else ("loss", *FORWARDED_LOGS)
        values = {k: v for k in names if isinstance(v := logs.get(k), (int, float))}
        if values:
            self.monitor.log(**values)


__all__ = ["BsmonCallback", "ResizableBatchSampler"]
