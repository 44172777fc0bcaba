"""Whether the job moves the learning rate itself (a hand-written schedule, like nanoGPT's
``get_lr(it)`` written into every group each step), which the autopilot cannot own: growing
the batch would leave that schedule keyed on steps.

The rates are read at each look (agent thread; a rate held in a device tensor is not read, so
no look waits on a device). A change between two looks with no batch change near is the job's
own; it is confirmed at the next look, because a switch that rescaled the rate may not have
reached the agent's records yet.
"""

from __future__ import annotations

import math

import torch

from .control import BatchController


class LearningRateOwner:
    def __init__(self, control: BatchController) -> None:
        self._control = control
        self._rates: tuple[float, ...] | None = None  # at the last look
        self._changes = 0  # batch changes known at the last look
        self._moved: tuple[float, float] | None = None  # seen once, to be confirmed

    def reset(self) -> None:
        self._rates = None

    def moved_by_the_job(self) -> str | None:
        """How the job moved the rate (confirmed over two looks), or None."""
        control = self._control
        rates = tuple(_rate(group["lr"]) for group in control.optimizer.param_groups)
        changes = len(control.changes)
        if changes != self._changes or control.upcoming is not None or self._rates is None:
            self._changes, self._rates, self._moved = changes, rates, None
            return None
        if rates == self._rates or any(math.isnan(r) for r in rates):
            self._moved = None
            return None
        if self._moved is None:
            self._moved = (self._rates[0], rates[0])
            return None
        return f"{self._moved[0]:.3g} → {rates[0]:.3g} with no batch change"


def _rate(lr: object) -> float:
    """A group's rate as a float, without waiting on a device (NaN: not read)."""
    if isinstance(lr, torch.Tensor):
        return float(lr) if lr.device.type == "cpu" and lr.numel() == 1 else math.nan
    try:
        return float(lr)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan
