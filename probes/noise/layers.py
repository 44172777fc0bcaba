"""Which layers bsmon measures per example, and how: discovery, coverage, dispatch.

Supported: nn.Linear (2-D and ≥3-D inputs), nn.Conv1d, nn.Conv2d, nn.Embedding, and the affine
parameters of nn.LayerNorm, nn.RMSNorm, nn.GroupNorm and nn.BatchNorm1d/2d/3d. Left out
(their parameters are excluded from both terms of the estimate, and coverage says how much
that is):

- parameters of other layers, and raw parameters used functionally;
- parameters held by two modules (tied weights: per-example norms of a shared parameter are
  not additive across its uses — research note §6.8);
- layers inside nn.MultiheadAttention (its out_proj weight is used functionally);
- nn.Embedding with scale_grad_by_freq (the scaling couples the examples).

Which dim of a layer's input holds the examples is not guessed from the layer: the model's
forward pass says how many examples it carries (``forward_watch``), and a layer call's batch
dim is the one of that size — dim 0, or dim 1 for layers applied position by position to a
sequence-first input (an LSTM language model's embedding and decoder). At run time a layer is
dropped, with an event naming its parameters, if a call's input has no batch dim (a position
embedding indexed with ``arange(T)`` and broadcast over the batch), if it runs twice in one
backward pass (weight sharing), or if its parameters receive gradient without its hook firing
(used functionally).
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..runtime.layer_inputs import batch_axes, kind_of, transposed_linear
from . import pernorms
from .autograd import grad_accumulator
from .scaling import AdamPreconditioner

SUPPORTED_NAMES = (
    "Linear (and Hugging Face's Conv1D), Conv1d/2d, Embedding, LayerNorm, RMSNorm, GroupNorm, "
    "BatchNorm"
)


class FastestMethod:
    """Times a layer's exact methods on its first calls and keeps the fastest: which one wins
    depends on the layer's shape and the device (on a CPU a convolution's two methods differ
    tenfold, one way on large images and the other on small ones). The trials run on the
    call's first ``TRIAL_EXAMPLES`` examples and their results are thrown away, so a slow
    method never runs on a whole batch; the call itself then runs the fastest so far. CPU
    trials are timed directly; on a GPU they are bracketed by CUDA events that are read later,
    once they have completed (a query, never a wait)."""

    TRIALS = 2
    TRIAL_EXAMPLES = 4

    def __init__(self, methods: tuple[str, ...]) -> None:
        self.methods = methods
        self.times: dict[str, list[float]] = {m: [] for m in methods}
        self._pending: list[tuple[str, object, object]] = []
        self.choice: str | None = None

    def pick(self, device: torch.device, trial: Callable[[str, int], object]) -> str:
        """The method for this call; until one is chosen, each method not yet timed
        ``TRIALS`` times first runs as ``trial(method, TRIAL_EXAMPLES)``."""
        if self.choice is not None:
            return self.choice
        self._collect()
        if all(len(t) >= self.TRIALS for t in self.times.values()):
            self.choice = min(self.methods, key=lambda m: sorted(self.times[m])[0])
            return self.choice
        started = {m: len(self.times[m]) for m in self.methods}
        for method, _, _ in self._pending:
            started[method] += 1
        for method in self.methods:
            if started[method] < self.TRIALS:
                self._time(method, device, lambda m=method: trial(m, self.TRIAL_EXAMPLES))
        timed = [m for m in self.methods if self.times[m]]
        return min(timed, key=lambda m: min(self.times[m])) if timed else self.methods[0]

    def _time(self, method: str, device: torch.device, run: Callable[[], object]) -> None:
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            self._pending.append((method, start, end))
            return
        began = time.perf_counter()
        run()
        self.times[method].append(time.perf_counter() - began)

    def _collect(self) -> None:
        still = []
        for method, start, end in self._pending:
            if end.query():  # type: ignore[attr-defined]
                self.times[method].append(start.elapsed_time(end) / 1000)  # type: ignore[attr-defined]
            else:
                still.append((method, start, end))
        self._pending = still


@dataclass(eq=False)
class Layer:
    name: str
    module: nn.Module
    kind: str
    weight: nn.Parameter | None
    bias: nn.Parameter | None
    accumulator: object = field(default=None, compare=False)
    methods: FastestMethod | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        self.accumulator = grad_accumulator(self.params[0])
        if self.kind == "conv":
            self.methods = FastestMethod(pernorms.CONV_METHODS)

    @functools.cached_property
    def params(self) -> tuple[nn.Parameter, ...]:
        return tuple(p for p in (self.weight, self.bias) if p is not None)

    @property
    def bias_measured(self) -> bool:
        return self.bias is not None and self.bias.requires_grad

    @property
    def numel(self) -> int:
        return sum(p.numel() for p in self.params)

    def batch_axes(self, dims: int) -> tuple[int, ...]:
        """The dims of a ``dims``-dimensional input that may hold the examples
        (``layer_inputs.batch_axes``: the rule the sample count shares)."""
        return batch_axes(self.module, self.kind, dims)

    def batch_axis(
        self, shape: tuple[int, ...], examples: int, index_dims: int | None, prefer: int
    ) -> int | None:
        """The dim of an input of ``shape`` that holds the pass's ``examples``; None when it
        has none (the input is not batched, e.g. positions broadcast over the batch).
        ``index_dims``: the dims of the model's integer input, which an embedding's batched
        indices share (a 1-D ``arange(T)`` is not a batch even when T equals the batch)."""
        if self.kind == "embedding" and index_dims is not None and len(shape) < index_dims:
            return None
        axes = [a for a in self.batch_axes(len(shape)) if shape[a] == examples]
        if len(axes) > 1:
            return prefer
        return axes[0] if axes else None

    @property
    def param_names(self) -> str:
        prefix = f"{self.name}." if self.name else ""
        named = (("weight", self.weight), ("bias", self.bias))
        return ", ".join(f"{prefix}{n}" for n, p in named if p is not None)

    def norms(
        self,
        x: Tensor | None,
        x_term: Tensor | None,
        g: Tensor,
        precond: AdamPreconditioner | None,
        batch_stats: bool,
        *,
        stats: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """Per-example squared norms (B,) of this layer's measured parameters (``stats``: a
        BatchNorm's batch statistics as its forward saved them, when known)."""
        weight = self.weight is not None and self.weight.requires_grad
        bias = self.bias is not None and self.bias.requires_grad
        w2 = (
            (
                precond.w2(self.weight) if weight else None,  # type: ignore[arg-type]
                precond.w2(self.bias) if bias else None,  # type: ignore[arg-type]
            )
            if precond is not None
            else (None, None)
        )
        m = self.module
        kind = self.kind
        flags = {"weight": weight, "bias": bias, "w2": w2}
        if kind == "linear":
            if w2[0] is not None and transposed_linear(m):  # weighted as W (in, out) is
                flags["w2"] = (w2[0].t(), w2[1])
            return pernorms.linear(x, g, x_term=x_term, **flags)
        assert x is not None
        if kind == "conv":
            chooser = self.methods
            assert chooser is not None

            def trial(method: str, n: int) -> Tensor:
                return pernorms.conv(m, x[:n], g[:n], method=method, **flags)  # type: ignore[arg-type, index]

            method = chooser.pick(g.device, trial)
            return pernorms.conv(m, x, g, method=method, **flags)  # type: ignore[arg-type]
        if kind == "embedding":
            if not weight:
                return g.new_zeros(g.shape[0], dtype=torch.float32)
            return pernorms.embedding(m, x, g, w2)  # type: ignore[arg-type]
        if kind == "layer_norm":
            return pernorms.layer_norm(m, x, g, stats=stats, **flags)  # type: ignore[arg-type]
        if kind == "rms_norm":
            return pernorms.rms_norm(m, x, g, weight=weight, w2=w2)
        if kind == "group_norm":
            return pernorms.group_norm(m, x, g, **flags)  # type: ignore[arg-type]
        return pernorms.batch_norm(m, x, g, batch_stats=batch_stats, stats=stats, **flags)  # type: ignore[arg-type]


@dataclass
class Discovery:
    layers: list[Layer]
    trainable_numel: int
    left_out: dict[str, int]  # reason -> parameters (elements) left out for it


def _excluded_subtrees(model: nn.Module) -> dict[str, str]:
    """Module-name prefixes whose layers must not be measured, with the reason."""
    return {
        name: "attention projections used functionally"
        for name, module in model.named_modules()
        if isinstance(module, nn.MultiheadAttention)
    }


def _under(name: str, prefixes: dict[str, str]) -> str | None:
    for prefix, reason in prefixes.items():
        if prefix in ("", name) or name.startswith(prefix + "."):
            return reason
    return None


def discover(model: nn.Module, trainable: list[Tensor]) -> Discovery:
    trainable_ids = {id(p) for p in trainable}
    owners: Counter[int] = Counter()
    for module in model.modules():
        for p in module._parameters.values():
            if p is not None:
                owners[id(p)] += 1
    excluded = _excluded_subtrees(model)
    layers: list[Layer] = []
    measured: set[int] = set()
    reasons: dict[int, tuple[int, str]] = {}
    for name, module in model.named_modules():
        kind = kind_of(module)
        why = _under(name, excluded)
        if why is None and kind is None:
            why = type(module).__name__
        chosen: dict[str, nn.Parameter] = {}
        for pname, p in module._parameters.items():
            if p is None or id(p) not in trainable_ids or id(p) in measured:
                continue
            if owners[id(p)] > 1:
                reasons[id(p)] = (p.numel(), "tied to another module")
            elif why is not None:
                reasons[id(p)] = (p.numel(), why)
            elif pname not in ("weight", "bias"):
                reasons[id(p)] = (p.numel(), type(module).__name__)
            else:
                chosen[pname] = p
                measured.add(id(p))
        if chosen:
            layers.append(
                Layer(name, module, kind, chosen.get("weight"), chosen.get("bias"))  # type: ignore[arg-type]
            )
    left_out: Counter[str] = Counter()
    for numel, reason in reasons.values():
        left_out[reason] += numel
    total = sum(p.numel() for p in {id(p): p for p in trainable}.values())
    return Discovery(layers, total, dict(left_out))
