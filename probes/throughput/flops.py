"""A training step's FLOPs, counted once from the model: its forward and backward run on the
meta device under ``torch.utils.flop_counter.FlopCounterMode``.

The training thread only notes the shapes of one training call's arguments (``InputShapes``);
the agent thread copies the model onto the meta device — its modules copied, its parameters
and buffers replaced by meta tensors of the same shapes, its hooks left behind, so nothing of
the user's model is touched or duplicated in memory — and runs the call on it. Meta tensors
have shapes and no data: the count costs host time only (0.04 s for a small model, 0.5 s
for GPT-2 small; about a second more the first time, as torch imports dynamo for a dispatch
mode) and no device memory. The count is the matmuls' (linear layers, convolutions,
attention's batched matmuls): 6·N per token plus attention for a GPT, the convention MFU is
quoted in.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ..runtime.losses import loss_of


@dataclass(frozen=True)
class TensorShape:
    """A tensor argument as the meta call rebuilds it."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool

    def meta(self) -> torch.Tensor:
        tensor = torch.zeros(self.shape, dtype=self.dtype, device="meta")
        return tensor.requires_grad_() if self.requires_grad else tensor


@dataclass(frozen=True)
class InputShapes:
    """One training call of the model: its arguments with each tensor replaced by its shape
    (other values kept as they were: ``targets=None``, flags), and its examples."""

    args: tuple
    kwargs: dict
    examples: int

    @classmethod
    def of(cls, args: tuple, kwargs: dict, examples: int) -> InputShapes:
        def shape(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                grad = value.requires_grad and value.is_floating_point()
                return TensorShape(tuple(value.shape), value.dtype, grad)
            return value

        return cls(pytree.tree_map(shape, args), pytree.tree_map(shape, kwargs), examples)

    def meta(self) -> tuple[tuple, dict]:
        def rebuild(value: Any) -> Any:
            return value.meta() if isinstance(value, TensorShape) else value

        return pytree.tree_map(rebuild, self.args), pytree.tree_map(rebuild, self.kwargs)


def unwrapped(model: nn.Module) -> nn.Module:
    """The user's module inside DistributedDataParallel or ``torch.compile``'s wrapper."""
    for attribute in ("module", "_orig_mod"):
        inner = getattr(model, attribute, None)
        if isinstance(inner, nn.Module) and type(model).__name__ in (
            "DistributedDataParallel",
            "OptimizedModule",
        ):
            model = inner
    return model


def sharded(model: nn.Module) -> bool:
    """Parameters that are DTensors (FSDP2, tensor parallel): the model's own calls would
    gather them across ranks."""
    return any(
        type(p).__name__ == "DTensor" or hasattr(p, "device_mesh") for p in model.parameters()
    )


def meta_copy(model: nn.Module) -> nn.Module:
    """The model's modules, copied, with meta parameters and buffers and no hooks."""
    memo: dict[int, Any] = {}
    for module in model.modules():  # _forward_hooks, _state_dict_pre_hooks, ...: left empty
        for name, value in vars(module).items():
            if "hooks" in name and isinstance(value, dict):
                memo[id(value)] = type(value)()
    for tensor in [*model.parameters(), *model.buffers()]:
        meta = torch.empty_like(tensor, device="meta")
        if isinstance(tensor, nn.Parameter):
            meta = nn.Parameter(meta, requires_grad=tensor.requires_grad)
        memo[id(tensor)] = meta
    return copy.deepcopy(model, memo)


def training_flops(model: nn.Module, call: InputShapes) -> tuple[float | None, str | None]:
    """The FLOPs of one forward and backward of ``call`` on ``model`` per example, or None and
    why it could not be counted."""
    from torch.utils.flop_counter import FlopCounterMode

    model = unwrapped(model)
    if sharded(model):
        return None, "FLOPs not counted: the model's parameters are sharded (DTensor)"
    try:
        meta = meta_copy(model)
        args, kwargs = call.meta()
        with FlopCounterMode(display=False) as counter:
            output = meta(*args, **kwargs)
            loss = _loss(output)
            if loss is not None and loss.requires_grad:
                _backward(loss, meta, (args, kwargs))
    except Exception as exc:  # a data-dependent model (.item(), a Python branch on values)
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return None, f"FLOPs not counted: the model did not run on the meta device ({reason})"
    total = counter.get_total_flops()
    if total <= 0 or call.examples <= 0:
        return None, "FLOPs not counted: the model's step has no matmuls FlopCounterMode counts"
    return total / call.examples, None


def _backward(loss: torch.Tensor, meta: nn.Module, inputs: Any) -> None:
    """The backward pass through ``torch.autograd.grad``, into what ``backward()`` would fill:
    not ``backward()``, which bsmon itself wraps in the job (the loss shown under ``bsmon
    run``, the step anatomy's backward mark): this pass is the agent's, not the job's."""
    wanted = [p for p in meta.parameters() if p.requires_grad]
    wanted += [
        t for t in pytree.tree_leaves(inputs) if isinstance(t, torch.Tensor) and t.requires_grad
    ]
    torch.autograd.grad(loss, wanted, allow_unused=True)


def _loss(output: Any) -> torch.Tensor | None:
    """What the backward runs from: the model's own loss, else the sum of its first floating
    output (the backward's matmuls are the same whatever the loss)."""
    loss = loss_of(output)
    if loss is not None:
        return loss
    for leaf in pytree.tree_leaves(output):
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
            return leaf.sum()
    return None
