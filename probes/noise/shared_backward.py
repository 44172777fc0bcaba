"""Another model's backward pass running through this one (a GAN, actor-critic).

A GAN's generator loss backpropagates through the discriminator: the discriminator's
parameters receive gradient from a backward pass that its own optimizer never steps on (the
generator's optimizer steps, and the discriminator's gradients are zeroed before its next
step). Per-step gradient statistics of the discriminator are then not defined, and neither
is its noise scale. Two models trained side by side in one process, each with its own loss,
are fine: neither's backward pass reaches the other.

So: while the noise scale measures (``arm`` at the end of the step before a measured one,
``disarm`` after it: nothing is registered on the steps between), a gradient hook on one
trainable parameter counts the backward passes that reach this model; when another optimizer
steps parameters outside this model and such a pass came after this optimizer's last step,
the pattern is found. (Several optimizers over the parameters of
one model, one per parameter group, share its backward pass: fine.) One counter bump per
backward pass; nothing on the model (a tensor hook on a parameter is not pickled or copied
with it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from ..runtime.fault_guard import FaultGuard


class SharedBackward:
    def __init__(
        self,
        model: torch.nn.Module | None,
        optimizer: torch.optim.Optimizer,
        on_found: Callable[[str], None],
        guard: FaultGuard,
    ) -> None:
        self._model = model
        self._optimizer = optimizer
        self._on_found = on_found
        self._guard = guard
        self.passes = 0  # backward passes that reached this model
        self._at_step = 0  # ... as of this optimizer's last step
        self.found = False
        self._sentinel = next(
            (p for g in optimizer.param_groups for p in g["params"] if p.requires_grad), None
        )
        self._handles: list[Any] = []

    @property
    def armed(self) -> bool:
        return bool(self._handles)

    def arm(self) -> None:
        """Watch from now (the end of this optimizer's step) on."""
        if self._handles or self.found:
            return
        self._at_step = self.passes
        self._handles.append(register_optimizer_step_pre_hook(self._any_step))
        if self._sentinel is not None:
            self._handles.append(self._sentinel.register_hook(self._reached))

    def disarm(self) -> None:
        self.remove()

    def _reached(self, _grad: torch.Tensor) -> None:
        self.passes += 1

    def step_ended(self) -> None:
        """This optimizer stepped: the passes so far were its own."""
        self._at_step = self.passes

    def _any_step(self, optimizer: torch.optim.Optimizer, _args: Any, _kwargs: Any) -> None:
        try:
            if optimizer is self._optimizer or self.found or self.passes == self._at_step:
                return
            if self._model is not None:
                ours = {id(p) for p in self._model.parameters()}
                params = (p for group in optimizer.param_groups for p in group["params"])
                if all(id(p) in ours for p in params):
                    return  # another optimizer over this model's own parameters
            self.found = True
            self._on_found(
                f"another optimizer ({type(optimizer).__name__}) steps after a backward pass "
                "that ran through this model (a GAN's generator loss through its "
                "discriminator, or actor-critic): this model's steps' gradient noise is not "
                "defined"
            )
        except Exception as exc:
            self._guard.report("the global optimizer pre-step hook", exc)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
