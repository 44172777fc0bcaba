"""The exact simple noise scale of a model as it is: every example's own gradient over a fixed
set of examples (``torch.func``), the unbiased tr Σ and |G|², and their ratio.

With per-example gradients g_1 … g_n and their mean ḡ:

    tr Σ = Σ_i |g_i − ḡ|² / (n − 1),    |G|² = |ḡ|² − tr Σ / n,    B_simple = tr Σ / |G|²

(|ḡ|² over-reads |G|² by tr Σ / n on average; the correction makes it unbiased). The set's own
sampling error is given as a jackknife over the chunks the examples are taken in.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

# loss of one example: (the model's output for it, with a leading batch dim of 1; its label)
ExampleLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Exact:
    """tr Σ, |G|² and B_simple over ``n`` examples; ``stderr``: B_simple's jackknife standard
    error over the chunks (None with fewer than 2 chunks)."""

    trace: float
    g2: float
    n: int
    stderr: float | None

    @property
    def b_simple(self) -> float:
        return self.trace / self.g2 if self.g2 > 0 else math.inf


@dataclass(frozen=True)
class _Sums:
    """A chunk's per-example gradients, summed (a vector) and squared-and-summed (a number)."""

    total: torch.Tensor
    squares: float
    n: int


def _parts(sums: list[_Sums]) -> tuple[float, float, int]:
    n = sum(s.n for s in sums)
    total = torch.stack([s.total for s in sums]).sum(0)
    mean_sq = float((total / n).square().sum())
    trace = (sum(s.squares for s in sums) - n * mean_sq) / (n - 1)
    return trace, mean_sq - trace / n, n


def exact_noise(
    model: nn.Module,
    loss_of: ExampleLoss,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    *,
    chunk: int = 256,
) -> Exact:
    """The exact B_simple of ``model``'s trainable parameters at their current values over
    ``inputs``/``labels`` (the first dim holds the examples), in chunks of ``chunk``.

    Nothing of the model changes: its parameters are read detached, no ``.grad`` is written,
    no random numbers are drawn, its mode stays as it is (which forward it runs: a model whose
    train and eval forwards differ should be given in the mode its training runs in)."""
    from torch.func import functional_call, grad, vmap

    params = {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}
    buffers = {name: b.detach() for name, b in model.named_buffers()}

    def one(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return loss_of(functional_call(model, {**p, **buffers}, (x[None],)), y[None])

    per_example = vmap(grad(one), in_dims=(None, 0, 0))
    sums = []
    for start in range(0, len(inputs), chunk):
        x, y = inputs[start : start + chunk], labels[start : start + chunk]
        grads = [g.reshape(-1) for g in per_example(params, x, y).values()]
        # a chunk's sums in the gradients' own precision (a few hundred terms each), the
        # chunks' in double: converting every per-example gradient costs more than the rest
        total = torch.cat([g.view(len(x), -1).sum(0).double() for g in grads])
        squares = sum(float(torch.dot(g, g)) for g in grads)
        sums.append(_Sums(total, squares, len(x)))
    trace, g2, n = _parts(sums)
    return Exact(trace, g2, n, _jackknife(sums))


def _jackknife(sums: list[_Sums]) -> float | None:
    """B_simple's standard error: the spread of the estimates that leave one chunk out."""
    k = len(sums)
    if k < 2:
        return None
    left_out = []
    for i in range(k):
        trace, g2, _ = _parts(sums[:i] + sums[i + 1 :])
        left_out.append(trace / g2 if g2 > 0 else math.inf)
    if not all(math.isfinite(b) for b in left_out):
        return None
    mean = sum(left_out) / k
    return math.sqrt((k - 1) / k * sum((b - mean) ** 2 for b in left_out))
