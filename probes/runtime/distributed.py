"""torch.distributed plumbing for the agent: a private gloo group and the step-boundary
exchange that makes every rank switch batch size at the same step.

The group is created once, at attach (``new_group`` is collective, so every rank must attach),
on gloo, so that it never competes with the job's NCCL streams.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


def ddp_of(
    model: object, trained: Iterable[torch.Tensor] = ()
) -> nn.parallel.DistributedDataParallel | None:
    """The DistributedDataParallel that trains ``model``: the model itself, or the outermost
    one it holds — frameworks wrap DDP in modules of their own (Lightning Fabric's
    ``_FabricModule``, timm's ``TrainingTask``), and that wrapper is what a script calls and
    what ``bsmon run`` finds. With ``trained`` (the optimizer's parameters), the first DDP that
    holds any of them. None when there is none (a scan of the modules, once, at attach)."""
    ddp_type = nn.parallel.DistributedDataParallel
    if isinstance(model, ddp_type):
        return model
    if not isinstance(model, nn.Module):
        return None
    wanted = {id(p) for p in trained}
    for module in model.modules():  # outer modules first
        if isinstance(module, ddp_type) and (
            not wanted or any(id(p) in wanted for p in module.parameters())
        ):
            return module
    return None


def fsdp2_of(model: object) -> bool:
    """Whether ``model`` is, or holds, a module sharded by FSDP2's ``fully_shard`` (which
    makes the module an ``FSDPModule``); False too where this torch has no FSDP2."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return False
    return isinstance(model, nn.Module) and any(isinstance(m, FSDPModule) for m in model.modules())


def world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def control_group() -> dist.ProcessGroup | None:
    """A new gloo group over all ranks, or None outside a multi-rank job."""
    if world()[1] <= 1:
        return None
    return new_gloo_group()


def new_gloo_group() -> dist.ProcessGroup:
    """A private gloo group over all ranks (collective: every rank must call it, in order)."""
    return dist.new_group(backend="gloo")


SYNC_EVERY = 8  # steps between exchanges: all ranks count the same steps, so they agree


class StepSync:
    """At the end of every ``every``-th step, rank 0's proposal is broadcast; every rank
    applies what the previous exchange carried, so all switch at the same step. The steps
    are the ranks' step numbers, which they share, not boundaries counted: a rank's other
    boundaries (a sampled or measured step of its own) fall on steps of its own.

    Each exchange waits for the previous broadcast (started ``every`` steps earlier, so it
    has normally finished) and starts the next one asynchronously: the job does not wait on
    the network in the common case. A change lands within 2 × ``every`` steps.
    """

    def __init__(self, group: dist.ProcessGroup, rank: int, every: int = SYNC_EVERY) -> None:
        self._group = group
        self._rank = rank
        self._every = every
        self._buffer = torch.zeros(1, dtype=torch.int64)
        self._work: dist.Work | None = None

    @property
    def every(self) -> int:
        return self._every

    def due(self, step: int) -> bool:
        """Whether the end of ``step`` exchanges."""
        return step % self._every == 0

    def next_due(self, step: int) -> int:
        """The next step after ``step`` whose end exchanges."""
        return (step // self._every + 1) * self._every

    def exchange(self, proposal: int) -> int:
        """Wait for the previous broadcast, return its value, start the next (collective)."""
        decided = 0
        if self._work is not None:
            self._work.wait()
            decided = int(self._buffer[0])
        self._buffer[0] = proposal if self._rank == 0 else 0
        self._work = dist.broadcast(self._buffer, src=0, group=self._group, async_op=True)
        return decided


# -- DeepSpeed ------------------------------------------------------------------------------
# ``deepspeed.initialize`` wraps the model in a ``DeepSpeedEngine`` (an ``nn.Module``: what the
# script calls) and, under ZeRO stage 1 or 2, the script's torch optimizer in a ZeRO optimizer
# that hands the torch one flat fp32 partitions instead of the parameters: no module holds the
# stepped optimizer's tensors, and the model is found through the engine that owns it.
# Nothing here imports deepspeed: an engine exists only where the script imported it.


def deepspeed_engine_class() -> type | None:
    """DeepSpeed's engine class, if the job imported deepspeed."""
    module = sys.modules.get("deepspeed")
    return getattr(module, "DeepSpeedEngine", None) if module is not None else None


def is_deepspeed_engine(model: object) -> bool:
    cls = deepspeed_engine_class()
    return cls is not None and isinstance(model, cls)


def find_deepspeed_engine(optimizer: torch.optim.Optimizer, objects: list[Any]) -> nn.Module | None:
    """The engine among ``objects`` (the heap) that steps ``optimizer``: its optimizer, what
    that wraps, or the optimizer it was given."""
    cls = deepspeed_engine_class()
    if cls is None:
        return None
    for obj in objects:
        if issubclass(type(obj), cls):
            outer = getattr(obj, "optimizer", None)
            held = (outer, getattr(outer, "optimizer", None), getattr(obj, "basic_optimizer", None))
            if any(o is optimizer for o in held):
                return obj
    return None
