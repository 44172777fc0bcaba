"""Sharded data parallelism (FSDP2's ``fully_shard``): per-example norms where the
activations are, the global gradient's |ḡ|² from every rank's shard of it.

Each rank runs the per-example source on its own examples: during forward and backward FSDP2
puts the unsharded parameters on the modules, so the layer inputs and output gradients the
hooks see are this rank's, whole. After the backward pass ``p.grad`` is a DTensor holding
this rank's shard of the averaged gradient ``ḡ``; the squared norm of its local tensor is
this rank's part of |ḡ|² (the shards do not overlap, FSDP2 pads none into ``p.grad``), and
|ḡ|² is their sum over the ranks (under HSDP each shard is held by every replica, and each
rank's part is divided by their number). Never a DTensor operation: one on ``p.grad`` itself would
be a collective on the training thread.

Units: FSDP2 averages the ranks' gradients — it divides their sum by ``divide`` (the data-
parallel size, or what ``set_gradient_divide_factor`` set) — so an example's contribution
``c_i`` to this rank's gradient is ``c_i / divide`` in ``ḡ``, and the step holds the
examples of every rank. The sums cross ranks in ``shard_totals``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from .autograd import grad_accumulator, total_squared_norm
from .layers import Layer
from .per_example import PerExampleSource
from .step_record import StepRecord

PRECONDITIONED = (
    "the Adam-preconditioned noise scale under sharding (each rank holds only its shard of "
    "Adam's state, and per-example norms need all of it)"
)


def _dtensor_type() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed
        return None
    return DTensor


def sharded(trainable: list[Tensor]) -> bool:
    """Whether the optimizer's parameters are DTensors (FSDP2 shards them so)."""
    dtensor = _dtensor_type()
    return dtensor is not None and any(isinstance(p, dtensor) for p in trainable)


def fsdp1(model: nn.Module | None) -> bool:
    """Whether ``model`` is, or holds, FSDP1's ``FullyShardedDataParallel``."""
    if model is None:
        return False
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:
        return False
    return any(isinstance(m, FullyShardedDataParallel) for m in model.modules())


def local(t: Tensor) -> Tensor:
    """This rank's part of a DTensor (no communication); any other tensor as it is."""
    return t.to_local() if hasattr(t, "to_local") else t


def replicas_of(trainable: list[Tensor]) -> int:
    """How many ranks hold each shard: HSDP (``fully_shard`` on a 2-D mesh) replicates the
    shards over the mesh's first dim, and their squared norms must be counted once."""
    for p in trainable:
        placements, mesh = getattr(p, "placements", None), getattr(p, "device_mesh", None)
        if placements is not None and mesh is not None:
            return math.prod(
                mesh.size(dim)
                for dim, placement in enumerate(placements)
                if placement.is_replicate()
            )
    return 1


def divide_factor(model: nn.Module, world: int) -> float:
    """What FSDP2 divides the ranks' summed gradients by: a factor set on one of the model's
    FSDP modules (``set_gradient_divide_factor``), else the ranks that average (``world``)."""
    for module in model.modules():
        state_of = getattr(module, "_get_fsdp_state", None)
        if state_of is None:
            continue
        for group in getattr(state_of(), "_fsdp_param_groups", ()):
            factor = getattr(group, "gradient_divide_factor", None)
            if factor:
                return float(factor)
    return float(world)


class ShardedSource(PerExampleSource):
    estimator = "sharded"

    def __init__(
        self,
        *args: Any,
        divide: float,
        step_part: Callable[[], Tensor | None] | None = None,
        **kwargs: Any,
    ) -> None:
        """``step_part``: this rank's part of |ḡ|², read at the optimizer step (DeepSpeed's:
        ``noise/zero``); None: the measured parameters' gradient shards, read
        after the backward pass (FSDP2's DTensor gradients)."""
        super().__init__(*args, **kwargs)
        self.sampler.allowed = False  # shard_totals adds up every rank's examples as its units
        self.divide = divide
        self._step_part = step_part
        self.replicas = replicas_of(self.params)
        self._bound: dict[Layer, int] = {}  # layer -> id of the unsharded parameter bound

    def _forward(
        self, layer: Layer, module: nn.Module, args: tuple, output: Any, pass_id: int
    ) -> None:
        """The layer holds FSDP2's unsharded parameter while it runs: its gradient
        accumulator, not the sharded one's, says whether this pass trains it."""
        if self.active:
            held = getattr(module, "weight" if layer.weight is not None else "bias", None)
            if isinstance(held, Tensor) and self._bound.get(layer) != id(held):
                self._bound[layer] = id(held)
                layer.accumulator = grad_accumulator(held)
        super()._forward(layer, module, args, output, pass_id)

    def _measure_total(self) -> None:
        """After each backward pass: this rank's shard of |ḡ|² over the measured parameters
        (where the shards are the parameters' own gradients)."""
        if self._step_part is not None:
            return
        grads = [local(p.grad) for p in self.params if p.grad is not None]
        if not grads:
            self._total = None
            return
        total = total_squared_norm(grads)
        self._set_total(total / self.replicas if self.replicas > 1 else total)

    def _set_total(self, total: Tensor | None) -> None:
        self._total = total
        if total is not None:
            self._scale = self.loss_scale.current(total.device)

    def _record(self, step: int) -> StepRecord | None:
        """This rank's part: its shard's |ḡ|², its examples' squared norms (in its own
        gradient's units) and their count. ``shard_totals`` sums them over the ranks."""
        if not self._sums:
            return None
        if self._step_part is not None:
            self._set_total(self._step_part())
        sums = self._sums
        values = [sums[0] if len(sums) == 1 else torch.stack(sums).sum()]
        fired = self._fired
        missing = [
            p for p in self.params if p.grad is not None and self._layer_of[id(p)] not in fired
        ]
        unaccounted: tuple[int, ...] = ()
        if missing:
            values.append(total_squared_norm([local(p.grad) for p in missing]))  # type: ignore[misc]
            unaccounted = tuple(id(p) for p in missing)
        return self._make(
            step,
            values,
            examples=self._examples,
            units=((self._examples, 1.0, 1.0 / (self.divide * self.divide)),),
            unaccounted=unaccounted,
        )

    def signature(self) -> int:
        """The measured parameters' elements: every rank must measure the same ones."""
        return sum(p.numel() for p in self.params)

    def detail(self) -> str:
        return super().detail() + ", |ḡ|² summed over the ranks' shards"
