"""The floor for measuring every step: the least machinery that yields the same numbers.

A forward hook on each layer bsmon measures keeps its input and puts a tensor hook on its
output; the tensor hook computes the per-example squared norms with bsmon's own formulas
(``probes.noise.pernorms``), and at the optimizer's pre-step hook the per-example sums and
|p.grad|² are stacked into one tensor, never read. No coverage checks, no budget, no guard, no
record: what is left between this and bsmon's every-step measuring is bsmon's bookkeeping.
Layers inside nn.MultiheadAttention are left out, as bsmon leaves them out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from bsmon.probes.noise import pernorms

PerExample = Callable[[nn.Module, Tensor, Tensor], Tensor]


def _linear(module: nn.Module, x: Tensor, g: Tensor) -> Tensor:
    bias = module.bias is not None
    if x.dim() == 2:  # |a_i|²|g_i|²: the input's part could be taken in the forward
        term = pernorms.linear_input_term(x, bias)
        return pernorms.linear(None, g, weight=True, bias=bias, x_term=term)
    return pernorms.linear(x, g, weight=True, bias=bias)


def _conv(module: nn.Module, x: Tensor, g: Tensor) -> Tensor:
    return pernorms.conv(module, x, g, weight=True, bias=module.bias is not None)  # type: ignore[arg-type]


def _embedding(module: nn.Module, x: Tensor, g: Tensor) -> Tensor:
    return pernorms.embedding(module, x, g)  # type: ignore[arg-type]


def _layer_norm(module: nn.Module, x: Tensor, g: Tensor) -> Tensor:
    affine = module.weight is not None
    bias = affine and module.bias is not None
    return pernorms.layer_norm(module, x, g, weight=affine, bias=bias)  # type: ignore[arg-type]


def _group_norm(module: nn.Module, x: Tensor, g: Tensor) -> Tensor:
    return pernorms.group_norm(module, x, g, weight=True, bias=True)  # type: ignore[arg-type]


FORMULAS: dict[type, PerExample] = {
    nn.Linear: _linear,
    nn.Conv1d: _conv,
    nn.Conv2d: _conv,
    nn.Embedding: _embedding,
    nn.LayerNorm: _layer_norm,
    nn.GroupNorm: _group_norm,
}


class FloorHooks:
    """Every step measured with the minimal hooks; ``latest`` is the last step's stacked
    [Σ_i |g_i|², |ḡ|²] (a device tensor)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        inside_attention = {
            id(m)
            for attention in model.modules()
            if isinstance(attention, nn.MultiheadAttention)
            for m in attention.modules()
        }
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.per_layer: list[Tensor] = []
        self.latest: Tensor | None = None
        self.handles: list[Any] = [optimizer.register_step_pre_hook(self._at_step)]
        for module in model.modules():
            formula = FORMULAS.get(type(module))
            if formula is not None and id(module) not in inside_attention:
                self.handles.append(module.register_forward_hook(self._forward(formula)))

    def _forward(self, formula: PerExample) -> Callable[..., None]:
        def hook(module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> None:
            x = inputs[0].detach()
            output.register_hook(lambda g: self.per_layer.append(formula(module, x, g)))

        return hook

    def _at_step(self, *_: object) -> None:
        grads = [p.grad for p in self.params if p.grad is not None]
        total = torch.stack(torch._foreach_norm(grads)).square().sum()
        per_example = torch.stack(self.per_layer).sum()
        self.latest = torch.stack([per_example, total])
        self.per_layer = []

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
