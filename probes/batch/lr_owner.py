"""Whether the job moves the learning rate itself (a hand-written schedule, like nanoGPT's
``get_lr(it)`` written into every group each step), which the autopilot cannot own: growing
the batch would leave that schedule keyed on steps; and how often the job's own scheduler
steps (``SchedulerPace``): once an epoch follows the data (a larger batch makes each epoch
fewer steps, the schedule in examples stays), once a step does not.

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
        self._scheduled = scheduler_steps(control.scheduler)  # its steps at the last look

    def reset(self) -> None:
        self._rates = None

    def moved_by_the_job(self) -> str | None:
        """How the job moved the rate (confirmed over two looks), or None."""
        control = self._control
        rates = tuple(_rate(group["lr"]) for group in control.optimizer.param_groups)
        changes = len(control.changes)
        scheduled = scheduler_steps(control.scheduler)
        if (
            changes != self._changes
            or scheduled != self._scheduled  # the scheduler moved it (its pace is judged apart)
            or control.upcoming is not None
            or self._rates is None
        ):
            self._changes, self._rates, self._moved = changes, rates, None
            self._scheduled = scheduled
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


PACE_STEPS = 50  # optimizer steps watched before a scheduler's pace counts as known


class SchedulerPace:
    """How often the job's learning-rate scheduler steps, against the optimizer's steps and
    the training DataLoader's epochs, from where the agent first looked (agent thread)."""

    def __init__(self, scheduler: object) -> None:
        self._scheduler = scheduler
        self._first: tuple[int, int, int] | None = None  # (optimizer step, its steps, epochs)
        self._now: tuple[int, int, int] | None = None

    def observe(self, step: int, epochs: int) -> None:
        stepped = scheduler_steps(self._scheduler)
        if stepped is None:
            return
        self._now = (step, stepped, epochs)
        if self._first is None:
            self._first = self._now

    def keyed_on_steps(self) -> str | None:
        """How it was seen stepping more often than once an epoch (None: it was not)."""
        if self._first is None or self._now is None:
            return None
        (step, stepped, epochs), first = self._now, self._first
        steps, stepped, epochs = step - first[0], stepped - first[1], epochs - first[2]
        if stepped <= max(epochs + 1, 1):  # one step an epoch, and one at the boundary watched
            return None
        name = type(self._scheduler).__name__
        return (
            f"the job's {name} stepped {stepped:,} times in {steps:,} optimizer steps over "
            f"{epochs:,} new epoch{'' if epochs == 1 else 's'} of its training DataLoader"
        )

    def unknown(self) -> str | None:
        """Why its pace is not known yet (None: known, or no scheduler to watch)."""
        if self._scheduler is None or self.keyed_on_steps() is not None:
            return None
        seen = self._now[0] - self._first[0] if self._first and self._now else 0
        if seen >= PACE_STEPS:
            return None
        return (
            f"watching how often the job's {type(self._scheduler).__name__} steps "
            f"({seen} of {PACE_STEPS} optimizer steps)"
        )


def scheduler_steps(scheduler: object) -> int | None:
    """How many times ``scheduler.step()`` ran (its ``last_epoch``; None: no such count)."""
    stepped = getattr(scheduler, "last_epoch", None)
    return stepped if isinstance(stepped, int) else None
