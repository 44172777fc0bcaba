"""What multiplies the gradients bsmon measures: a mixed-precision loss scale, and (optionally)
Adam's preconditioner."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class LossScale:
    """The loss scale of a ``torch.amp.GradScaler`` (or a look-alike), read without a sync.

    Gradients seen during backward carry the scale S (squared norms S²); bsmon divides by S²
    on the agent thread, so every step is measured as if after ``scaler.unscale_`` — and,
    being taken during backward, before any clipping the user does after unscaling."""

    def __init__(self, scaler: Any | None) -> None:
        self._ones: dict[torch.device, Tensor] = {}
        if scaler is not None and not (
            hasattr(scaler, "_scale") or callable(getattr(scaler, "get_scale", None))
        ):
            raise TypeError(
                "grad_scaler must be a torch.amp.GradScaler (or have get_scale()), "
                f"got {type(scaler).__name__}"
            )
        self.scaler = scaler

    def one(self, device: torch.device) -> Tensor:
        one = self._ones.get(device)
        if one is None:
            one = self._ones[device] = torch.ones((), device=device)
        return one

    def current(self, device: torch.device) -> Tensor:
        """The scale in force now, as a 0-dim float32 tensor on ``device`` (a copy: the scaler
        updates its own tensor in place after the step; the constant 1 is shared, and copied
        when the step's values are stacked)."""
        scaler = self.scaler
        if scaler is None or not _enabled(scaler):
            return self.one(device)
        scale = getattr(scaler, "_scale", None)
        if isinstance(scale, Tensor):
            return scale.detach().reshape(()).to(device=device, dtype=torch.float32, copy=True)
        if hasattr(scaler, "_scale"):  # a GradScaler before its first scale(): no scaling yet
            return self.one(device)
        return torch.tensor(float(scaler.get_scale()), device=device)


def _enabled(scaler: Any) -> bool:
    is_enabled = getattr(scaler, "is_enabled", None)
    return bool(is_enabled()) if callable(is_enabled) else True


class AdamPreconditioner:
    """Adam's elementwise preconditioner P = 1/(√v̂ + ε), as the squared weight P² applied to
    squared gradients, so bsmon can report the preconditioned noise scale tr(PΣP)/|PG|²
    (AdaptDL's "PGNS"; the paper's B_simple is the raw one). Uses the optimizer state as it is
    during backward, i.e. after the previous step."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        groups = optimizer.param_groups
        if not all("betas" in g and "eps" in g for g in groups):
            raise ValueError(
                "noise_preconditioned=True needs an Adam-family optimizer (Adam, AdamW, ...), "
                f"got {type(optimizer).__name__}"
            )
        self.optimizer = optimizer
        self._group = {id(p): g for g in groups for p in g["params"]}
        self._cache: dict[int, Tensor | None] = {}

    def new_step(self) -> None:
        self._cache.clear()

    def ready(self, params: list[Tensor]) -> bool:
        """Whether every parameter has Adam state yet (not before the first step)."""
        return all(self.w2(p) is not None for p in params)

    def w2(self, param: Tensor) -> Tensor | None:
        key = id(param)
        if key in self._cache:
            return self._cache[key]
        value = self._compute(param)
        self._cache[key] = value
        return value

    def _compute(self, param: Tensor) -> Tensor | None:
        state = self.optimizer.state.get(param)  # type: ignore[call-overload]
        group = self._group.get(id(param))
        if not state or group is None:
            return None
        v = state.get("max_exp_avg_sq") if group.get("amsgrad") else state.get("exp_avg_sq")
        step = state.get("step")
        if v is None or step is None:
            return None
        beta2 = group["betas"][1]
        # a CPU step tensor stays on the CPU: a 0-dim CPU tensor mixes with CUDA ones without
        # a copy (moving it to the device would be a synchronising host-to-device copy)
        correction = 1 - beta2**step
        denom = (v.float() / correction).sqrt() + group["eps"]
        return denom.reciprocal().square()
