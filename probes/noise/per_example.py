"""Per-example gradient norms inside the backward pass: bsmon's default on one device.

A forward hook on every supported layer registers a hook on the layer's output; when the
output's gradient arrives during backward, the layer's per-example squared norms are computed
from it and the layer's input (``pernorms``) and summed on the device into one 0-dim tensor.
At the end of the backward pass the step's gradient norm |p.grad|² is taken over the same
parameters. The estimate then uses single examples as the small batch (B_s = 1, B_b = B):
the lowest-variance form (research note §1.4, §8.1).

Gradient accumulation works too (every example of every micro-batch is a unit), and so does
DDP when the wrapped model is passed (the local examples against the all-reduced gradient),
but ``auto`` prefers the micro-batch estimators there, as the issue asks.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import torch
from torch import Tensor, nn

from . import pernorms
from .autograd import accumulates, total_squared_norm
from .layers import Discovery, Layer, discover
from .record import StepRecord
from .source import Source, hook


class _LayerHook:
    """The forward hook on one layer. A small bsmon object rather than a partial, so code that
    copies a model (the probe's sidecar) can tell bsmon's hooks from the user's."""

    __slots__ = ("layer", "source")

    def __init__(self, source: PerExampleSource, layer: Layer) -> None:
        self.source = source
        self.layer = layer

    def __call__(self, module: nn.Module, args: tuple, output: Any) -> None:
        self.source._forward(self.layer, module, args, output)


class PerExampleSource(Source):
    estimator = "per_example"

    def __init__(self, model: nn.Module, trainable: list[Tensor], **kwargs: Any) -> None:
        self.discovery: Discovery = discover(model, trainable)
        self._batch_norms = [
            m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
        ]
        super().__init__([], **kwargs)
        self.layers: list[Layer] = []
        self._handles: dict[Layer, Any] = {}
        for layer in self.discovery.layers:
            self._handles[layer] = layer.module.register_forward_hook(_LayerHook(self, layer))
            self.layers.append(layer)
        self._refresh()
        self._entries: list[tuple[Layer, Tensor, int]] = []  # this backward pass
        self._sums: list[Tensor] = []  # this step
        self._examples = 0
        self._fired: set[Layer] = set()
        self._with_grad = 0

    def _refresh(self) -> None:
        self.params = [p for layer in self.layers for p in layer.params]
        self._layer_of = {id(p): layer for layer in self.layers for p in layer.params}
        measured = sum(p.numel() for p in self.params)
        total = self.discovery.trainable_numel
        self.coverage = measured / total if total else 0.0

    # -- hooks (training thread) ---------------------------------------------------------------

    @hook("per-example forward hook")
    def _forward(self, layer: Layer, module: nn.Module, args: tuple, output: Any) -> None:
        if not torch.is_grad_enabled():
            return
        if not isinstance(output, Tensor) or not output.requires_grad:
            return
        x = args[0] if args else None
        if not layer.accepts(x):
            return  # an unbatched call: its gradient will be unaccounted, see _record
        x_sq = None
        if layer.kind == "linear" and x.dim() == 2 and self.precond is None:
            x_sq = pernorms.linear_input_sq(x)  # keep (B,) instead of the input
            x = None
        batch_stats = layer.kind == "batch_norm" and (
            module.training or getattr(module, "running_mean", None) is None
        )
        output.register_hook(functools.partial(self._gradient, layer, x, x_sq, batch_stats))

    @hook("per-example norms")
    def _gradient(
        self, layer: Layer, x: Tensor | None, x_sq: Tensor | None, batch_stats: bool, g: Tensor
    ) -> None:
        if not accumulates(layer.accumulator):
            return  # torch.autograd.grad or backward(inputs=...): not a training gradient
        sq = layer.norms(x, x_sq, g, self.precond, batch_stats)
        self._entries.append((layer, sq.sum(), sq.shape[0]))
        self._end.touch()

    def _on_backward_end(self) -> None:
        entries, self._entries = self._entries, []
        if not entries:
            return
        fired = Counter(layer for layer, _, _ in entries)
        for layer, count in fired.items():
            if count > 1:
                self._problem = "a layer ran twice in one backward pass"
                self.exclude(layer, f"ran {count} times in one backward pass (shared weights)")
        sizes = {n for _, _, n in entries}
        if len(sizes) > 1:
            self._problem = (
                f"layers disagree on the batch size (dim 0: {sorted(sizes)}); "
                "per-example norms need batch-first inputs"
            )
        self._sums.extend(total for _, total, _ in entries)
        self._examples += max(sizes)
        self._fired.update(fired)
        super()._on_backward_end()
        self._with_grad = sum(1 for p in self.params if p.grad is not None)

    # -- step ----------------------------------------------------------------------------------

    def _record(self, step: int) -> StepRecord | None:
        if not self._sums:
            return None
        values = [torch.stack(self._sums).sum()]
        unaccounted: tuple[int, ...] = ()
        fired_params = sum(len(layer.params) for layer in self._fired if layer in self._handles)
        if self._with_grad > fired_params:  # some measured gradient came without its hook
            missing = [
                p
                for p in self.params
                if p.grad is not None and self._layer_of[id(p)] not in self._fired
            ]
            if missing:
                values.append(total_squared_norm([p.grad for p in missing]))  # type: ignore[misc]
                unaccounted = tuple(id(p) for p in missing)
        world = self.world
        return self._make(
            step,
            values,
            examples=self._examples * world,
            units=((self._examples, 1.0, 1.0 / (world * world)),),
            unaccounted=unaccounted,
        )

    def _clear(self) -> None:
        self._entries = []
        self._sums = []
        self._examples = 0
        self._fired = set()
        self._with_grad = 0

    # -- layers --------------------------------------------------------------------------------

    def exclude(self, layer: Layer, why: str) -> None:
        handle = self._handles.pop(layer, None)
        if handle is None:
            return
        handle.remove()
        self.layers.remove(layer)
        self._refresh()
        if self.backwards:  # this step's norms were gathered over the old set of layers
            self._problem = "the measured layers changed during this step"
        self.emit(
            f"noise scale: left out {layer.name or type(layer.module).__name__} "
            f"({type(layer.module).__name__}): {why}; coverage now {self.coverage:.0%}",
            "warning",
        )

    def exclude_params(self, ids: tuple[int, ...], why: str) -> None:
        for layer in {self._layer_of[i] for i in ids if i in self._layer_of}:
            self.exclude(layer, why)

    def detail(self) -> str:
        text = f"per example, {self.coverage:.0%} of trainable parameters"
        left_out = self.discovery.left_out
        if left_out:
            text += (
                " (not measured: " + ", ".join(sorted(left_out, key=left_out.get)[::-1][:2]) + ")"
            )
        if any(m.training for m in self._batch_norms):
            text += "; BatchNorm couples the examples, so approximate"
        return text

    def close(self) -> None:
        super().close()
        for handle in self._handles.values():
            handle.remove()
        self._handles.clear()
