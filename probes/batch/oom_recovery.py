"""Recovering from an out-of-memory error inside ``mon.guard()`` (training thread)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..runtime.context import JobContext
from ..runtime.hot_path import HotPath
from ..runtime.samples import StepSamples
from .control import BatchController, Pending
from .oom import release_memory


class OomRecovery:
    """``mon.guard()``'s recovery from an out-of-memory error (training thread): memory freed,
    the batch size back to the last size that ran, the step's ``mon.dataloader`` samples
    re-queued, its counts and marks dropped."""

    def __init__(
        self,
        control: BatchController,
        hot: HotPath,
        *,
        samples: StepSamples,
        ctx: JobContext,
        discard_marks: Callable[[], None] = lambda: None,
    ) -> None:
        self._control = control
        self._hot = hot
        self._samples = samples
        self._ctx = ctx
        self._discard_marks = discard_marks

    def recover(self, exc: BaseException, optimizer: torch.optim.Optimizer) -> bool:
        """Whether the job may go on after ``exc`` (False: nothing to shrink to)."""
        control = self._control
        failed = control.size
        arrived = control.arrived
        cause = f" ({arrived.reason})" if arrived is not None and arrived.value == failed else ""
        fallback = control.shrink_after_oom(self._ctx.progress.step)
        if fallback is None:
            return False
        exc.__traceback__ = None  # its frames hold the failed step's activations
        optimizer.zero_grad(set_to_none=True)
        release_memory()
        requeued = self._requeue()
        self._samples.discard()
        self._discard_marks()
        self._hot.micro_batches = 0
        self._hot.wake()
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
        self._ctx.warn(
            "oom",
            f"out of memory at batch {failed}{cause}; {now}; {again}",
            data={"failed": failed, "now": control.size, "requeued": requeued},
        )
        return True

    def _requeue(self) -> int:
        """The step's batches back into their loaders; how many samples."""
        requeued = 0
        for loader, indices in self._hot.batches_since_step:
            loader.requeue(indices)
            requeued += len(indices)
        self._hot.batches_since_step = []
        return requeued
