"""Learning-rate rescaling when the batch size changes from B0 to B1.

- ``auto`` (the default): the rule that fits the optimizer in use: ``linear`` for SGD (with
  or without momentum), ``sqrt`` for Adam-type (adaptive) optimizers; an optimizer bsmon does
  not know keeps its rate, and the event says so.
- ``linear``: × B1/B0 (Goyal et al. 2017, for SGD).
- ``sqrt``: × √(B1/B0) (Malladi et al. 2022, the square-root rule for Adam and RMSprop).
- ``noise``: × (1 + φ/B0)/(1 + φ/B1), the gain from the gradient noise scale φ (McCandlish
  et al. 2018, AdaScale); its square root for Adam-type optimizers.

docs/batch-control.md gives the sources and why the rule must match the optimizer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

POLICIES = ("auto", "linear", "sqrt", "noise")
DEFAULT = "auto"
ADAM_LIKE = (
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.Adamax,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.RMSprop,
    torch.optim.Adagrad,
    torch.optim.Adadelta,
    torch.optim.SparseAdam,
)
SGD_LIKE = (torch.optim.SGD,)
ADAPTIVE_NAMES = ("adam", "lamb", "lion", "adafactor", "rmsprop", "adagrad", "sophia", "shampoo")


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
    if isinstance(optimizer, ADAM_LIKE):
        return True
    if isinstance(optimizer, SGD_LIKE):
        return False
    name = type(optimizer).__name__.lower()  # third-party adaptive optimizers (LAMB, Lion, ...)
    return any(part in name for part in ADAPTIVE_NAMES)


@dataclass(frozen=True)
class Rule:
    """The rule a policy means for one optimizer: ``policy`` is what ``lr_factor`` applies
    (None: the rate stays, ``why`` says why), ``label`` how the event names it."""

    policy: str | None
    label: str
    adam_like: bool = False
    why: str = ""


def rule_for(policy: str | None, optimizer: torch.optim.Optimizer) -> Rule:
    """What ``attach(lr_scaling=policy)`` does for ``optimizer``."""
    name = type(optimizer).__name__
    adam = is_adam_like(optimizer)
    if policy is None:
        return Rule(None, "off", adam, "lr_scaling=None")
    if policy == "auto":
        if adam:
            return Rule("sqrt", f"sqrt rule for {name}", adam)
        if isinstance(optimizer, SGD_LIKE):
            return Rule("linear", f"linear rule for {name}", adam)
        return Rule(
            None,
            "off",
            adam,
            f"no rule known for {name} (attach(lr_scaling='linear' or 'sqrt') chooses one)",
        )
    if policy == "noise":
        root = ", square root for Adam-type" if adam else ""
        return Rule("noise", f"noise-scale rule{root}", adam)
    return Rule(policy, f"{policy} rule, chosen", adam)


def owned_by_scheduler(optimizer: torch.optim.Optimizer) -> bool:
    """A learning-rate scheduler was made for this optimizer (it leaves ``initial_lr`` in
    every group), so it may set the rate again at its next step."""
    return any("initial_lr" in group for group in optimizer.param_groups)


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


def describe(changes: list[tuple[float, float]]) -> str:
    """``lr 0.001 → 0.00141`` (the first group; how many more moved by the same factor)."""
    if not changes:
        return "no parameter groups"
    old, new = changes[0]
    others = len(changes) - 1
    more = f" (and {others} more group{'' if others == 1 else 's'} alike)" if others else ""
    return f"lr {old:.3g} → {new:.3g}{more}"
