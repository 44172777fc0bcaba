"""Linear regression with a closed-form simple noise scale, for the noise-scale tests and
benchmarks/noise_accuracy.py.

x ~ N(0, diag(c)), y = w*·x (+ b*) + ξ with ξ ~ N(0, σ²), per-example loss ½(w·x + b − y)²,
δ = w − w*, β = b − b* (research note §7). With learning rate 0 the truth stays fixed:

    no bias:  tr Σ = (δᵀCδ + σ²)·tr C + δᵀC²δ,                |G|² = δᵀC²δ
    bias:     tr Σ = (δᵀCδ + β² + σ²)·tr C + δᵀC²δ + δᵀCδ + σ², |G|² = δᵀC²δ + β²

(the bias case reduces to the note's (d+2)|δ|² + dβ² + (d+1)σ² for C = I; checked here by
a 4·10⁶-sample Monte-Carlo when it was written).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from bsmon.probes import attach

if TYPE_CHECKING:
    from bsmon.probes import Monitor


@dataclass(frozen=True)
class Case:
    name: str
    c: tuple[float, ...]  # diagonal of the input covariance
    delta: tuple[float, ...]
    sigma2: float = 1.0
    beta: float | None = None  # bias offset b − b*; None: no bias parameter

    def truth(self) -> float:
        c = torch.tensor(self.c, dtype=torch.float64)
        d = torch.tensor(self.delta, dtype=torch.float64)
        dcd, dc2d, trc = float((c * d * d).sum()), float((c * c * d * d).sum()), float(c.sum())
        if self.beta is None:
            return ((dcd + self.sigma2) * trc + dc2d) / dc2d
        b2 = self.beta**2
        trace = (dcd + b2 + self.sigma2) * trc + dc2d + dcd + self.sigma2
        return trace / (dc2d + b2)


ISO = Case("iso", c=(1.0,) * 10, delta=(0.16,) * 10)  # B_simple ≈ 50.1
ISO_BIAS = Case("iso+bias", c=(1.0,) * 10, delta=(0.16,) * 10, beta=0.2)  # ≈ 48.9
ANISO = Case("aniso", c=(4.0, 1.0, 1.0, 0.25), delta=(0.1, 0.2, 0.0, 0.4))  # 34.33
ANISO_BIAS = Case("aniso+bias", c=(4.0, 1.0, 1.0, 0.25), delta=(0.1, 0.2, 0.0, 0.4), beta=0.3)
NOTE_MAIN = Case("note §7.2 main", c=(1.0,) * 10, delta=(0.1,) * 10)  # 111 exactly


class Regression:
    """A model at fixed parameters (lr 0) and a stream of fresh batches."""

    def __init__(self, case: Case, seed: int = 0) -> None:
        self.case = case
        d = len(case.c)
        self.model = nn.Linear(d, 1, bias=case.beta is not None)
        self.w_star = torch.ones(d)
        with torch.no_grad():
            self.model.weight.copy_(self.w_star + torch.tensor(case.delta))
            if case.beta is not None:
                self.model.bias.fill_(case.beta)  # b* = 0
        self.scale = torch.tensor(case.c).sqrt()
        self.generator = torch.Generator().manual_seed(seed)

    def batches(self, steps: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """All the data of a run at once (steps, batch, d) and (steps, batch): fast to draw."""
        g = self.generator
        x = torch.randn(steps, batch, len(self.case.c), generator=g) * self.scale
        noise = torch.randn(steps, batch, generator=g) * self.case.sigma2**0.5
        return x, x @ self.w_star + noise


def train(
    job: Regression,
    optimizer: torch.optim.Optimizer,
    *,
    steps: int,
    batch: int,
    micro: int = 1,
    reduction: str = "mean",
    divide_by_micro: bool = True,
    ddp: nn.Module | None = None,
    no_sync: bool = True,
) -> None:
    """``steps`` optimizer steps of ``batch`` examples in ``micro`` backward passes each;
    under DDP every micro-batch but the last under ``no_sync`` (else each one all-reduces)."""
    xs, ys = job.batches(steps, batch)
    model = ddp if ddp is not None else job.model
    size = batch // micro
    for step in range(steps):
        for j in range(micro):
            x = xs[step, j * size : (j + 1) * size]
            y = ys[step, j * size : (j + 1) * size]
            # under DDP, every micro-batch but the last accumulates locally (no_sync)
            last = j == micro - 1
            local = ddp is not None and no_sync and not last
            sync = ddp.no_sync() if local else contextlib.nullcontext()
            with sync:
                residual = model(x).squeeze(-1) - y
                per_example = 0.5 * residual.square()
                loss = per_example.mean() if reduction == "mean" else per_example.sum()
                if divide_by_micro and reduction == "mean":
                    loss = loss / micro
                loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def measuring(
    model: nn.Module, optimizer: torch.optim.Optimizer, batch: int, **options: object
) -> Monitor:
    """attach() for tests: no socket, every step measured (no cost budget)."""
    options.setdefault("serve", False)
    options.setdefault("noise_budget", None)
    return attach(model, optimizer, batch_size=batch, **options)  # type: ignore[arg-type]
