"""``attach()``'s options checked before anything is built: a wrong argument is the user's to
fix, so it is a clear error at once (and nothing is left half attached)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import torch

from ..batch.adam_rules import AdamRules
from ..batch.lr_scaling import DEFAULT as DEFAULT_LR_SCALING
from ..batch.lr_scaling import POLICIES as LR_POLICIES
from ..batch.policy import StepRule
from ..noise import DEFAULT_BUDGET as NOISE_BUDGET
from ..noise import MODES as NOISE_SCALE_MODES

NOISE_SCALE_CHOICES = NOISE_SCALE_MODES


def _check_positive_int(name: str, value: object, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Options:
    """``attach()``'s keyword options (DESIGN.md and docs/api.md say what each does)."""

    batch_size: int | None = None
    name: str | None = None
    loss_fn: Any = None
    noise_scale: str | None = "auto"
    noise_window: int = 1000
    noise_preconditioned: bool = False
    noise_budget: float | None = NOISE_BUDGET
    grad_scaler: Any = None
    socket_dir: str | os.PathLike[str] | None = None
    record: bool | str | os.PathLike[str] = True
    sample_interval_s: float = 1.0
    serve: bool = True
    max_batch_size: int | None = None
    min_batch_size: int = 1
    batch_step: StepRule = "double"
    micro_batch_size: int | None = None
    lr_scaling: str | None = DEFAULT_LR_SCALING
    lr_scheduler: Any = None
    adam_moments: str = AdamRules.moments
    adam_beta2: str = AdamRules.beta2
    adam_weight_decay: str = AdamRules.weight_decay
    probe_step: Callable[[torch.nn.Module, Any], torch.Tensor] | None = None
    ranks_view: bool = True
    batch_dim: int | None = None
    step_anatomy: bool = True
    autopilot: bool = False
    autopilot_half_batch: float | None = None

    def adam_rules(self) -> AdamRules:
        return AdamRules(self.adam_moments, self.adam_beta2, self.adam_weight_decay)


def check_options(model: object, optimizer: object, options: Options) -> None:
    """Wrong arguments to attach() are the user's to fix: a clear error, at once."""
    o = options
    batch_size, batch_dim, name = o.batch_size, o.batch_dim, o.name
    noise_scale, micro_batch_size, lr_scaling = o.noise_scale, o.micro_batch_size, o.lr_scaling
    autopilot, autopilot_half_batch = o.autopilot, o.autopilot_half_batch
    sample_interval_s, noise_window = o.sample_interval_s, o.noise_window
    _check_positive_int("batch_size", batch_size)
    _check_positive_int("noise_window", noise_window, allow_none=False)
    _check_positive_int("micro_batch_size", micro_batch_size)
    if batch_dim is not None and (
        isinstance(batch_dim, bool) or not isinstance(batch_dim, int) or batch_dim < 0
    ):
        raise ValueError(f"batch_dim must be a non-negative integer, got {batch_dim!r}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"bsmon needs a torch.optim.Optimizer, got {type(optimizer).__name__}; "
            "an optimizer must subclass torch.optim.Optimizer and call its __init__"
        )
    if model is not None and not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if noise_scale is not None and noise_scale not in NOISE_SCALE_CHOICES:
        choices = ", ".join(repr(c) for c in (*NOISE_SCALE_CHOICES, None))
        raise ValueError(f"noise_scale must be one of {choices}, got {noise_scale!r}")
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    if not sample_interval_s > 0:
        raise ValueError(f"sample_interval_s must be positive, got {sample_interval_s!r}")
    if lr_scaling is not None and lr_scaling not in LR_POLICIES:
        raise ValueError(
            f"lr_scaling must be one of {', '.join(map(repr, LR_POLICIES))} or None, "
            f"got {lr_scaling!r}"
        )
    o.adam_rules()  # a wrong rule is a ValueError naming it
    if micro_batch_size is not None:
        if batch_size is None:
            raise ValueError("micro_batch_size needs batch_size (the effective batch per step)")
        if batch_size % micro_batch_size:  # type: ignore[operator]
            raise ValueError(
                f"batch_size {batch_size} must be a multiple of micro_batch_size {micro_batch_size}"
            )
    if not isinstance(autopilot, bool):
        raise ValueError(f"autopilot must be True or False, got {autopilot!r}")
    if autopilot and batch_size is None:
        raise ValueError("autopilot=True needs batch_size (the size it starts from)")
    if autopilot_half_batch is not None and not (
        isinstance(autopilot_half_batch, (int, float))
        and not isinstance(autopilot_half_batch, bool)
        and 0 < autopilot_half_batch < float("inf")
    ):
        raise ValueError(
            f"autopilot_half_batch must be a positive number (B½ of the step time), "
            f"got {autopilot_half_batch!r}"
        )


def checked_options(model: object, optimizer: object, given: dict[str, Any]) -> Options:
    """``given`` as ``Options``, checked: an unknown name is a TypeError, a wrong value a
    ValueError (or a TypeError for the model and optimizer), before anything is built."""
    known = {field.name for field in dataclasses.fields(Options)}
    for name in given:
        if name not in known:
            raise TypeError(f"attach() got an unexpected keyword argument {name!r}")
    options = Options(**given)
    check_options(model, optimizer, options)
    return options
