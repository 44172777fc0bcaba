"""What an Adam-type optimizer carries across a batch change, beside its learning rate.

A batch change moves the learning rate by a rule (``lr_scaling``); three more of the
optimizer's settings were tuned for the old size, and each has a rule of its own here,
applied at the same step boundary, on the training thread, once per change:

- ``adam_moments``: the running moments. ``"keep"`` (the default); ``"reset"`` (zeroed, with
  the step count: Adam starts its averages again, bias correction included); ``"rescale"``
  (the second moment, which estimates E[g²] = |G|²·(1 + φ/B) per coordinate on average,
  times (1 + φ/B1)/(1 + φ/B0) with φ = B_simple, so the step Adam takes matches the new
  batch's noise at once; without an estimate of φ they are kept, and the event says so).
- ``adam_beta2``: ``"examples"`` (the default): β2 → β2^(B1/B0), its half-life kept in
  examples rather than in steps (Marek et al. 2025: a larger batch takes fewer steps per
  example, and β2 tuned in steps would average over more examples than it was tuned for);
  or ``"keep"``.
- ``adam_weight_decay``: ``"keep"`` (the default), or ``"timescale"``: a decoupled decay
  (AdamW) moves by (B1/B0)/(lr factor), so the decay's timescale in examples, τ = B/(η·λ),
  stays (Bergsma et al. 2025, "Power Lines"). With the square-root rule that is √(B1/B0). An
  L2 decay (Adam's ``weight_decay`` without ``decoupled_weight_decay``) is part of the
  gradient and stays.

Only optimizers whose state or groups hold these names are touched (Adam, AdamW, NAdam,
RAdam, Adamax: moments; every group with ``betas``: β2); the words say what moved, for the
change's event. The defaults are what measured best on ``benchmarks/autopilot.py``'s AdamW
task (docs/batch-control.md gives the runs): β2 in examples took fewer examples to the target
in every arm; a reset helped the fixed ramps but not the autopilot's own changes; the decay's
timescale took 31–69% more examples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

MOMENTS = ("keep", "reset", "rescale")
BETA2 = ("keep", "examples")
WEIGHT_DECAY = ("keep", "timescale")
SECOND_MOMENTS = ("exp_avg_sq", "max_exp_avg_sq")
FIRST_MOMENTS = ("exp_avg", "exp_inf")


@dataclass(frozen=True)
class AdamRules:
    """The three rules, as ``attach()`` was given them."""

    moments: str = "keep"
    beta2: str = "examples"
    weight_decay: str = "keep"

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("adam_moments", self.moments, MOMENTS),
            ("adam_beta2", self.beta2, BETA2),
            ("adam_weight_decay", self.weight_decay, WEIGHT_DECAY),
        ):
            if value not in allowed:
                choices = ", ".join(map(repr, allowed))
                raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def carry_over(
    optimizer: torch.optim.Optimizer,
    rules: AdamRules,
    old: int,
    new: int,
    *,
    lr_factor: float | None,
    noise_scale: float | None,
) -> list[str]:
    """Apply ``rules`` to ``optimizer`` for a change ``old`` → ``new``; what moved, in words
    (empty when nothing did)."""
    said = []
    if rules.beta2 == "examples":
        said += _beta2(optimizer, new / old)
    if rules.weight_decay == "timescale":
        said += _weight_decay(optimizer, (new / old) / (lr_factor or 1.0))
    if rules.moments == "reset":
        said += _reset(optimizer)
    elif rules.moments == "rescale":
        said += _rescale(optimizer, old, new, noise_scale)
    return said


def _beta2(optimizer: torch.optim.Optimizer, power: float) -> list[str]:
    moved = []
    for group in optimizer.param_groups:
        betas = group.get("betas")
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            continue
        beta1, beta2 = betas
        before = float(beta2)
        after = before**power
        if isinstance(beta2, torch.Tensor):
            beta2.fill_(after)  # in place: a compiled or capturable step holds this tensor
        else:
            group["betas"] = (beta1, after)
        moved.append((before, after))
    if not moved:
        return []
    return [f"β2 {moved[0][0]:.4g} → {moved[0][1]:.4g} (half-life kept in examples)"]


def _decoupled(optimizer: torch.optim.Optimizer, group: dict) -> bool:
    return isinstance(optimizer, torch.optim.AdamW) or bool(group.get("decoupled_weight_decay"))


def _weight_decay(optimizer: torch.optim.Optimizer, factor: float) -> list[str]:
    moved = []
    for group in optimizer.param_groups:
        decay = group.get("weight_decay")
        if not decay or not _decoupled(optimizer, group):
            continue
        group["weight_decay"] = decay * factor
        moved.append((decay, decay * factor))
    if not moved:
        return []
    return [f"weight decay {moved[0][0]:.3g} → {moved[0][1]:.3g} (timescale kept in examples)"]


def _states(optimizer: torch.optim.Optimizer, *names: str) -> list[dict]:
    """The parameters' states that hold one of ``names``."""
    return [state for state in optimizer.state.values() if any(n in state for n in names)]


def _reset(optimizer: torch.optim.Optimizer) -> list[str]:
    states = _states(optimizer, "exp_avg_sq", "exp_inf")
    for state in states:
        for name in (*FIRST_MOMENTS, *SECOND_MOMENTS, "step"):
            value = state.get(name)
            if isinstance(value, torch.Tensor):
                value.zero_()
            elif name == "step" and value is not None:
                state[name] = 0
    return [f"moments reset ({len(states)} tensors' averages start again)"] if states else []


def _rescale(
    optimizer: torch.optim.Optimizer, old: int, new: int, noise_scale: float | None
) -> list[str]:
    states = _states(optimizer, "exp_avg_sq")
    if not states:
        return []
    if noise_scale is None or not math.isfinite(noise_scale) or noise_scale <= 0:
        return ["moments kept (no B_simple to rescale them by yet)"]
    factor = (1 + noise_scale / new) / (1 + noise_scale / old)
    for state in states:
        for name in SECOND_MOMENTS:
            value = state.get(name)
            if isinstance(value, torch.Tensor):
                value.mul_(factor)
    return [f"second moments × {factor:.3g} (the noise at B_simple {noise_scale:.3g})"]
