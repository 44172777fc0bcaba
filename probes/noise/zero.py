"""DeepSpeed's averaged gradient, where the noise scale reads it (the engine is found in
``runtime/distributed``).

Under ZeRO stage 1 or 2 the torch optimizer steps flat fp32 partitions, not the model's
parameters: the parameters carry no gradient at the step, and the partitions' are clipped by
then (DeepSpeed clips at norm 1.0 unless told otherwise). But the ZeRO optimizer has just
computed the norm of the whole averaged gradient across the ranks, before clipping: |ḡ|² is
its square. Under stage 0 the engine all-reduces the whole gradient into every rank's
parameters, read there when nothing clips it. Either way every rank knows all of |ḡ|², and
adds 1/world of it to the ranks' sums (``shard_totals``), where its examples' per-example
norms, taken on the model's layers as under FSDP2, meet the other ranks'.

Stage 3 partitions the parameters themselves, and fp16's loss scale is DeepSpeed's own:
neither is measured (``unsupported``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .autograd import total_squared_norm


@dataclass(frozen=True, slots=True)
class ZeroLayout:
    """What bsmon needs of an engine whose torch optimizer is ``optimizer``."""

    stage: int
    world: int  # the data-parallel ranks the gradient is averaged over
    params: list[Tensor]  # the model's parameters that train (per-example norms' layers)
    part: Callable[[], Tensor | None]  # this rank's part of |ḡ|², at the optimizer step
    unsupported: str | None  # why the noise scale cannot be measured, if it cannot


def zero_layout(engine: Any, optimizer: torch.optim.Optimizer, ranks: int) -> ZeroLayout:
    """The engine's layout, in a job of ``ranks`` processes."""
    stage = int(engine.zero_optimization_stage())
    world = int(getattr(engine, "dp_world_size", 1) or 1)
    params = [p for p in engine.module.parameters() if p.requires_grad]
    if stage == 0:
        part = functools.partial(_whole_gradient, params, world)
    else:
        part = functools.partial(_global_norm, engine.optimizer, world)
    return ZeroLayout(stage, world, params, part, _unsupported(engine, stage, world, ranks))


def _whole_gradient(params: list[Tensor], world: int) -> Tensor | None:
    """Stage 0: every rank holds the whole averaged gradient (all-reduced by the engine
    after the backward pass): its share, |ḡ|² / world."""
    grads = [p.grad for p in params if p.grad is not None]
    return total_squared_norm(grads) / world if grads else None


def _global_norm(zero_optimizer: Any, world: int) -> Tensor | None:
    """Stages 1 and 2: the norm of the whole averaged gradient, which the ZeRO optimizer
    computes across the ranks before it clips (DeepSpeed clips at 1.0 unless told
    otherwise) and steps the torch one: its share, |ḡ|² / world."""
    norm = getattr(zero_optimizer, "_global_grad_norm", None)
    if norm is None:
        return None
    norm = torch.as_tensor(norm, dtype=torch.float32)
    return norm * norm / world


def _unsupported(engine: Any, stage: int, world: int, ranks: int) -> str | None:
    if world != ranks:
        return (
            f"DeepSpeed averages the gradient over {world} of the job's {ranks} ranks (model "
            "or pipeline parallelism), which bsmon's sums over every rank do not follow"
        )
    if stage >= 3:
        return (
            "DeepSpeed ZeRO-3 partitions the parameters themselves (a layer's weight exists "
            "only while it runs), which bsmon's per-example norms do not follow yet"
        )
    if engine.fp16_enabled():
        return (
            "DeepSpeed's fp16 loss scale is its own (not a torch GradScaler), and bsmon does "
            "not divide it out yet"
        )
    if stage == 0 and (engine.bfloat16_enabled() or engine.gradient_clipping() > 0):
        return (
            "DeepSpeed without ZeRO clips the gradient before the optimizer step and keeps no "
            "norm of it (gradient_clipping: 0 in the config lets bsmon measure it)"
        )
    return None
