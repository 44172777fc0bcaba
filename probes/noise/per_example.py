"""Per-example gradient norms inside the backward pass: bsmon's default on one device.

On a measured step the forward watch (``forward_watch``, global module hooks: nothing is
stored on the model) sees each call of a supported layer and registers a hook on the call's
output; when the output's gradient arrives during backward, the layer's per-example squared
norms are computed from it and the layer's input (``pernorms``) and summed on the device into
one 0-dim tensor. At the end of the backward pass the step's gradient norm |p.grad|² is taken
over the same parameters. The estimate then uses single examples as the small batch
(B_s = 1, B_b = B): the lowest-variance form (research note §1.4, §8.1).

The examples are those of the model's forward pass (its input's batch dimension, see
``forward_watch``), not whatever dim 0 of a layer's input happens to be: a layer call whose
input has no dim of that size is not batched, and the layer is left out, named in an event,
while the others go on being measured.

Gradient accumulation works too (every example of every micro-batch is a unit), and so does
DDP when the wrapped model is passed (the local examples against the all-reduced gradient),
but ``auto`` prefers the micro-batch estimators there.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.linalg import vector_norm

from ..runtime.audience import examples_unknown
from ..runtime.forward_watch import ForwardWatch
from . import pernorms
from .autograd import accumulates, total_squared_norm
from .layers import Discovery, Layer, discover
from .sampling import Sampler
from .source import Source
from .step_record import StepRecord

HOLDER = "per-example norms"
UNBATCHED = "its input has no batch dimension"
BATCH_NORM_COUPLED = (
    "per-example norms read |G|² below zero: BatchNorm's batch statistics couple the examples "
    "of a batch, so their gradients are not independent draws (more so the smaller the "
    "batch); with gradient accumulation or DDP the micro-batches or ranks are the small "
    "batches and give an estimate"
)


def batch_norm_coupled(model: nn.Module | None) -> str | None:
    """Why per-example norms do not fit ``model`` — a BatchNorm layer in training mode —
    or None. Through the batch statistics every example's gradient depends on the others':
    BatchNorm's backward pass centres the output gradient over the batch, so the examples'
    contributions are negatively correlated and the estimate of |G|² reads low, below zero
    unless the batch is far above B_simple (a ResNet-18-style CNN at batch 32: below zero
    after 500 measured steps, ``benchmarks/warmup_cost.py``). They also cost a third to a half
    of a step on a CNN. Micro-batches of an accumulating step, or DDP's ranks, each have their
    own statistics and fit."""
    if model is None:
        return None
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and (
            module.training or getattr(module, "running_mean", None) is None
        ):
            return (
                f"BatchNorm in training mode ({type(module).__name__}) couples the examples of "
                "a batch, so per-example norms cannot resolve |G|² and would cost a third of a "
                "step or more"
            )
    return None


class LayerCall(NamedTuple):
    """One call of a measured layer, kept from its forward until its output's gradient."""

    layer: Layer
    x: Tensor | None  # the input; None when ``term`` stands for it
    term: Tensor | None  # pernorms.linear_input_term of a 2-D input
    shape: torch.Size
    batch_stats: bool
    stats: tuple[Tensor, Tensor] | None  # a BatchNorm's or LayerNorm's (mean, 1/std), as saved
    pass_id: int


class LinearCall(NamedTuple):
    """A call of an nn.Linear whose weight is measured, with a 2-D input and no
    preconditioner: bsmon's commonest layer call, kept lean. Its input's row norms |a_i| are
    taken in the forward (so the input can be freed), its output gradient's |g_i| in the
    backward, and the layers' Goodfellow products at the end of the pass, all at once."""

    layer: Layer
    a_norm: Tensor  # (rows,) float32
    bias: bool
    rows: int
    pass_id: int


LEAN_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # norms taken in float32


def _goodfellow_sum(lean: list[tuple[LinearCall, Tensor]]) -> Tensor:
    """Σ over the calls and their examples of |g_i|²(|a_i|² + 1 with a bias): each call's
    per-example norms (``pernorms.linear``), summed in a handful of ops for all of them."""
    g = torch.cat([g_norm for _, g_norm in lean]) if len(lean) > 1 else lean[0][1]
    a = torch.cat([c.a_norm for c, _ in lean]) if len(lean) > 1 else lean[0][0].a_norm
    ga = g * a
    total = torch.dot(ga, ga)
    if all(c.bias for c, _ in lean):
        return total + torch.dot(g, g)
    biased = [g_norm for c, g_norm in lean if c.bias]
    if biased:
        gb = torch.cat(biased)
        total = total + torch.dot(gb, gb)
    return total


class PerExampleSource(Source):
    estimator = "per_example"
    skips_unmeasured_steps = True

    def __init__(
        self,
        model: nn.Module,
        trainable: list[Tensor],
        watch: ForwardWatch,
        examples_hint: Callable[[], int | None],
        **kwargs: Any,
    ) -> None:
        self.discovery: Discovery = discover(model, trainable)
        self._batch_norms = [
            m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
        ]
        super().__init__([], **kwargs)
        self.watch = watch
        self._examples_hint = examples_hint
        self.layers: list[Layer] = list(self.discovery.layers)
        self._live: set[Layer] = set(self.layers)  # the same, for O(1) membership in hooks
        for layer in self.layers:
            watch.watch_layer(layer.module, functools.partial(self._forward, layer))
        self._refresh()
        # this backward pass: (layer, per-example squared norms (B,), examples, pass id)
        self._entries: list[tuple[Layer, Tensor, int, int]] = []
        self._lean: list[tuple[LinearCall, Tensor]] = []  # this pass's LinearCalls and |g_i|
        self._sums: list[Tensor] = []  # this step
        self._examples = self._units = 0  # this step's examples; those whose norms it took
        self.sampler = Sampler(allowed=self.world == 1)
        self._fired: set[Layer] = set()
        self.refused: str | None = None  # why the forward watch cannot serve this job
        self.set_measuring(False)  # the controller decides from the first step on

    def _refresh(self) -> None:
        self.params = [p for layer in self.layers for p in layer.params]
        self._layer_of = {id(p): layer for layer in self.layers for p in layer.params}
        measured = sum(p.numel() for p in self.params)
        total = self.discovery.trainable_numel
        self.coverage = measured / total if total else 0.0

    def set_measuring(self, measuring: bool) -> None:
        super().set_measuring(measuring)
        if self.active and self.watch.hold(HOLDER):
            return
        self.watch.release(HOLDER)
        self.refused = self.watch.blocked()
        self.active = False

    # -- hooks (training thread) ---------------------------------------------------------------

    def _forward(
        self, layer: Layer, module: nn.Module, args: tuple, output: Any, pass_id: int
    ) -> None:
        """A measured layer's call (the forward watch): keep what its gradient will need.
        Lean on purpose: it runs for every measured layer call of a measured step."""
        if not self.active or not isinstance(output, Tensor) or not torch.is_grad_enabled():
            return
        started = time.perf_counter()
        try:
            x = args[0] if args else None
            if not output.requires_grad or not isinstance(x, Tensor):
                return  # the parameters' gradient, if any, is caught as unaccounted
            weight = layer.weight
            if (
                layer.kind == "linear"
                and x.dim() == 2
                and self.precond is None
                and x.dtype in LEAN_DTYPES
                and weight is not None
                and weight.requires_grad
            ):
                a_norm = vector_norm(x.detach(), dim=1, dtype=torch.float32)
                call: Any = LinearCall(layer, a_norm, layer.bias_measured, x.shape[0], pass_id)
                hook: Callable[..., None] = self._linear_gradient
            else:
                call, hook = self._layer_call(layer, module, x, output, pass_id), self._gradient
            # a pre-hook on the node that made the output, registered in C (a tensor hook's
            # handle and dict cost ~16 µs a call on the CPU); grads[output_nr] is the output's
            node = output.grad_fn
            if node is not None:
                node.register_prehook(functools.partial(hook, call, output.output_nr))
            else:  # the output is a leaf
                output.register_hook(lambda g: hook(call, 0, (g,)))
        except Exception as exc:
            self.report("per-example forward hook", exc)
        finally:
            self.cost += time.perf_counter() - started

    def _layer_call(
        self, layer: Layer, module: nn.Module, x: Tensor, output: Tensor, pass_id: int
    ) -> LayerCall:
        """What any other measured layer call's gradient will need."""
        term = None
        if layer.kind == "linear" and x.dim() == 2 and self.precond is None:
            term = pernorms.linear_input_term(x, layer.bias_measured)  # (B,), not x
        batch_stats = layer.kind == "batch_norm" and (
            module.training or getattr(module, "running_mean", None) is None
        )
        stats = pernorms.batch_norm_stats(output) if batch_stats else None
        if layer.kind == "layer_norm":
            stats = pernorms.layer_norm_stats(output)
        x_kept = None if term is not None else x
        return LayerCall(layer, x_kept, term, x.shape, batch_stats, stats, pass_id)

    def _linear_gradient(self, call: LinearCall, index: int, grads: tuple) -> None:
        """The output gradient of a ``LinearCall`` (``grads[index]``, see ``_forward``):
        |g_i|, kept for the end of the pass (the examples of its pass are checked there, once
        the pass is known)."""
        g = grads[index]
        if not self.active or g is None:
            return
        started = time.perf_counter()
        try:
            if accumulates(call.layer.accumulator) and call.layer in self._live:
                self._lean.append((call, vector_norm(g.detach(), dim=1, dtype=torch.float32)))
                self._end.touch()
        except Exception as exc:
            self.report("per-example norms", exc)
        finally:
            self.cost += time.perf_counter() - started

    def _gradient(self, call: LayerCall, index: int, grads: tuple) -> None:
        """The output gradient of one measured layer call (``grads[index]``, see
        ``_forward``): its per-example squared norms."""
        g = grads[index]
        if not self.active or g is None:
            return
        started = time.perf_counter()
        try:
            self._norms(call, g)
        except Exception as exc:
            self.report("per-example norms", exc)
        finally:
            self.cost += time.perf_counter() - started

    def _norms(self, call: LayerCall, g: Tensor) -> None:
        layer, x, term, shape, batch_stats, stats, pass_id = call
        if not accumulates(layer.accumulator):
            return  # torch.autograd.grad or backward(inputs=...): not a training gradient
        if layer not in self._live:
            return  # left out earlier in this pass
        examples, index_dims = self._pass_examples(pass_id)
        if not examples:
            self._problem = (
                "bsmon cannot tell how many examples the model's forward pass carried "
                f"({examples_unknown()})"
            )
            return
        if shape[0] == examples and term is not None:
            axis: int | None = 0  # the common case: a 2-D input, batch first
        else:
            axis = layer.batch_axis(tuple(shape), examples, index_dims, self.watch.learned_dim or 0)
        if axis is None:
            self.exclude(layer, UNBATCHED, f"input {list(shape)}, {examples} examples")
            return
        if axis:
            g = g.movedim(axis, 0)
            x = x.movedim(axis, 0) if x is not None else None
            if stats is not None and layer.kind == "layer_norm":  # shaped as the input
                stats = (stats[0].movedim(axis, 0), stats[1].movedim(axis, 0))
        self.sampler.heavy_seen |= x is not None and x.dim() > 2  # inline: measured steps' calls
        if self.sampler.on and (rows := self.sampler.rows(examples)) is not None:
            g, x, term, stats = rows.cut(g, x, term, stats, layer.kind == "layer_norm")
        sq = layer.norms(x, term, g, self.precond, batch_stats, stats=stats)
        self._entries.append((layer, sq, examples, pass_id))
        self._end.touch()

    def _pass_examples(self, pass_id: int) -> tuple[int | None, int | None]:
        """The examples of the forward pass a layer call belonged to, and the dims of the
        model's integer input; the batch the job drew when the model's own forward is not
        called (a framework calling its submodules)."""
        root = self.watch.pass_of(pass_id)
        if root is not None and root.examples:
            return root.examples, root.index_dims
        return self._examples_hint(), None

    def _on_backward_end(self) -> None:
        live = self._live
        entries = [entry for entry in self._entries if entry[0] in live]
        lean = [e for e in self._lean if e[0].layer in live and self._batched(e[0])]
        self._entries, self._lean = [], []
        if not entries and not lean:
            return
        calls = [(e[0], e[3]) for e in entries] + [(c.layer, c.pass_id) for c, _ in lean]
        if len(set(calls)) < len(calls):
            for (layer, _), count in Counter(calls).items():
                if count > 1 and layer in live:  # twice in one forward pass
                    self._problem = "a layer ran twice in one forward pass"
                    self.exclude(layer, "shared weights", f"ran {count} times in one forward pass")
        passes = {pass_id: n for _, _, n, pass_id in entries}
        passes.update((c.pass_id, c.rows) for c, _ in lean)
        lean = self.sampler.lean(lean) if self.sampler.on else lean
        # one reduction for the whole pass (not one per layer)
        sums = [torch.cat([sq for _, sq, _, _ in entries]).sum()] if entries else []
        if lean:
            sums.append(_goodfellow_sum(lean))
        self._sums.append(sums[0] if len(sums) == 1 else sums[0] + sums[1])
        examples = sum(passes.values())
        self._examples += examples
        self._units += self.sampler.taken(passes) if self.sampler.on else examples
        self._fired.update(layer for layer, _ in calls)
        super()._on_backward_end()

    def _batched(self, call: LinearCall) -> bool:
        """Whether a ``LinearCall``'s rows are the examples of its pass (``_norms``' test, for
        a 2-D input whose only batch dim is 0); the layer is left out when they are not."""
        examples, _ = self._pass_examples(call.pass_id)
        if not examples:
            self._problem = (
                "bsmon cannot tell how many examples the model's forward pass carried "
                f"({examples_unknown()})"
            )
            return False
        if call.rows != examples:
            self.exclude(call.layer, UNBATCHED, f"input [{call.rows}, …], {examples} examples")
            return False
        return True

    # -- step ----------------------------------------------------------------------------------

    def _record(self, step: int) -> StepRecord | None:
        if not self._sums:
            return None
        sums = self._sums
        values = [sums[0] if len(sums) == 1 else torch.stack(sums).sum()]
        unaccounted: tuple[int, ...] = ()
        fired_params = sum(len(layer.params) for layer in self._fired if layer in self._live)
        if fired_params < len(self.params) and fired_params < sum(
            1 for p in self.params if p.grad is not None
        ):  # some measured gradient came without its hook
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
            units=((self._units, 1.0, 1.0 / (world * world)),),
            unaccounted=unaccounted,
        )

    def _clear(self) -> None:
        if self.sampler.heavy_seen:  # else it never samples: no call on a measured step
            self.sampler.end_step(bool(self._sums), self._batch_norms)
        self._entries = []
        self._lean = []
        self._sums = []
        self._examples = self._units = 0
        self._fired = set()

    # -- layers --------------------------------------------------------------------------------

    def exclude(self, layer: Layer, why: str, context: str = "") -> None:
        """Stop measuring ``layer`` (its parameters leave both terms of the estimate)."""
        if layer not in self._live:
            return
        self.watch.unwatch_layer(layer.module)
        self.layers.remove(layer)
        self._live.discard(layer)
        self._refresh()
        if self.backwards or self._sums:  # this step's norms were gathered over the old layers
            self._problem = "the measured layers changed during this step"
        left_out = self.discovery.left_out
        left_out[why] = left_out.get(why, 0) + layer.numel
        self.emit(
            f"noise scale: left out {layer.param_names} ({type(layer.module).__name__}): "
            f"{why}{f' ({context})' if context else ''}; coverage now {self.coverage:.0%}",
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
        return text + self.sampler.describe()

    def below_zero(self) -> str:
        if not any(m.training for m in self._batch_norms):
            return super().below_zero()
        return BATCH_NORM_COUPLED

    def close(self) -> None:
        super().close()
        self.watch.release(HOLDER)
        for layer in self.layers:
            self.watch.unwatch_layer(layer.module)
