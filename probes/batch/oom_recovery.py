"""Recovering from an out-of-memory error inside ``mon.guard()`` (training thread)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from ..runtime.context import JobContext
from ..runtime.hot_path import HotPath
from ..runtime.samples import StepSamples
from .control import BatchController, Pending
from .oom import release_memory


@dataclasses.dataclass(eq=False, repr=False)
class OomRecovery:
    """``mon.guard()``'s recovery from an out-of-memory error (training thread): memory freed,
    the batch size back to the last size that ran, the step's ``mon.dataloader`` samples
    re-queued, its counts and marks dropped."""

    control: BatchController
    hot: HotPath
    samples: StepSamples
    ctx: JobContext
    discard_marks: Callable[[], None] = lambda: None

    def recover(self, exc: BaseException, optimizer: torch.optim.Optimizer) -> bool:
        """Whether the job may go on after ``exc`` (False: nothing to shrink to)."""
        control = self.control
        failed = control.size
        arrived = control.arrived
        cause = f" ({arrived.reason})" if arrived is not None and arrived.value == failed else ""
        fallback = control.shrink_after_oom(self.ctx.progress.step)
        if fallback is None:
            return False
        exc.__traceback__ = None  # its frames hold the failed step's activations
        optimizer.zero_grad(set_to_none=True)
        release_memory()
        requeued = self._requeue()
        self.samples.discard()
        self.discard_marks()
        self.hot.micro_batches = 0
        self.hot.wake()
        if fallback != control.size:
            control.switch(Pending(fallback, f"out of memory at {failed}", "oom guard"))
        again = (
            f"{requeued} samples will run again in batches of {control.loader_size}"
            if requeued
            else "its samples are skipped (mon.dataloader re-runs them)"
        )
        now = (
            f"now {control.accumulation_steps} micro-batches of {control.loader_size}"
            if control.micro is not None
            else f"back to {control.size}, the last size that ran"
        )
        self.ctx.warn(
            "oom",
            f"out of memory at batch {failed}{cause}; {now}; {again}",
            data={"failed": failed, "now": control.size, "requeued": requeued},
        )
        return True

    def _requeue(self) -> int:
        """The step's batches back into their loaders; how many samples."""
        requeued = 0
        for loader, indices in self.hot.batches_since_step:
            loader.requeue(indices)
            requeued += len(indices)
        self.hot.batches_since_step = []
        return requeued
