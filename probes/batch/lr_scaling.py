"""Learning-rate rescaling when the batch size changes from B0 to B1.

- ``linear``: × B1/B0 (Goyal et al. 2017).
- ``sqrt``: × √(B1/B0).
- ``noise``: × (1 + φ/B0)/(1 + φ/B1), the gain from the gradient noise scale φ (McCandlish
  et al. 2018, AdaScale); its square root for Adam-type optimizers.
"""

from __future__ import annotations

import math
from typing import Any

import torch

POLICIES = ("linear", "sqrt", "noise")
ADAM_LIKE = (
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.Adamax,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.RMSprop,
    torch.optim.Adagrad,
    torch.optim.Adadelta,
)


class NoFactor(ValueError):
    """The policy cannot give a factor now (e.g. no noise-scale estimate yet)."""


def lr_factor(
    policy: str, old: int, new: int, noise_scale: float | None = None, adam_like: bool = False
) -> float:
    if policy == "linear":
        return new / old
    if policy == "sqrt":
        return math.sqrt(new / old)
    if policy == "noise":
        if noise_scale is None or not math.isfinite(noise_scale) or noise_scale <= 0:
            raise NoFactor("no noise-scale estimate yet")
        gain = (1 + noise_scale / old) / (1 + noise_scale / new)
        return math.sqrt(gain) if adam_like else gain
    raise ValueError(f"lr_scaling must be one of {POLICIES} or None, got {policy!r}")


def is_adam_like(optimizer: torch.optim.Optimizer) -> bool:
    return isinstance(optimizer, ADAM_LIKE)


def rescale(
    optimizer: torch.optim.Optimizer, factor: float, scheduler: Any = None
) -> list[tuple[float, float]]:
    """Multiply every group's learning rate (and a scheduler's base rates) by ``factor``.

    Returns (old, new) per param group. Schedulers that recompute the rate from their base
    rates (LambdaLR, cosine, ...) would undo a change to ``group["lr"]`` alone, so their
    ``base_lrs`` and the groups' ``initial_lr`` are scaled too.
    """
    changes = []
    for group in optimizer.param_groups:
        old = float(group["lr"])
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].mul_(factor)  # in place: a compiled or capturable step holds this tensor
        else:
            group["lr"] = old * factor
        if "initial_lr" in group:
            group["initial_lr"] = group["initial_lr"] * factor
        changes.append((old, old * factor))
    if scheduler is not None and hasattr(scheduler, "base_lrs"):
        scheduler.base_lrs = [lr * factor for lr in scheduler.base_lrs]
    return changes
