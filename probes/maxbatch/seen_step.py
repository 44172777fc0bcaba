"""The probe's step for a script bsmon did not change (``bsmon run --resizable``): rebuilt from
one training step of the model, seen once.

A script under ``bsmon run`` declares no loss: the loss is whatever it calls ``backward()``
on. The probe can reproduce it where it is computed by the model or by a standard loss
module:

- the model returns its loss (a scalar, ``output.loss``, ``output["loss"]``, or a scalar in a
  returned tuple, as nanoGPT's ``(logits, loss)``): the sidecar calls the model on the inputs
  of the step it saw, and takes the loss from the same place;
- the script applies an ``nn`` loss module (``nn.CrossEntropyLoss()`` …) to the model's output
  as it is: the sidecar applies that module to the model's output and the same target.

Anything else (a functional loss, a reshaped output) is refused with the reason. Seeing the
step costs one global module forward hook for that one step; only references to the inputs
and the target are kept (never the output, which holds the step's graph).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook

from ..batch.loader import batch_length
from ..runtime.losses import loss_of

NOT_REPRODUCIBLE = (
    "bsmon run: the loss is computed outside the model by code bsmon cannot replay "
    "(no nn loss module is applied to the model's output as it is); "
    "attach(..., loss_fn=...) in the script enables the probe"
)
WAITING = "bsmon run: the probe waits to see one training step of the model"


def _scalar(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.numel() == 1 and value.is_floating_point()


@dataclass(frozen=True)
class ModelLoss:
    """``probe_step`` for a model that computes its own loss (pickled into the recipe):
    ``index`` picks it from a returned tuple, else ``loss_of`` finds it."""

    index: int | None = None

    def __call__(self, model: nn.Module, batch: tuple[tuple, dict]) -> torch.Tensor:
        args, kwargs = batch
        output = model(*args, **kwargs)
        return loss_of(output) if self.index is None else output[self.index]


def model_loss(output: Any) -> ModelLoss | None:
    """How to take the loss from a model's output like this one: what ``loss_of`` finds (the
    output itself, ``output["loss"]``, ``output.loss``) or the one scalar in a returned tuple;
    None when the model does not return its loss."""
    found = loss_of(output)
    if found is not None and found.is_floating_point():
        return ModelLoss()
    if isinstance(output, (tuple, list)):
        scalars = [i for i, item in enumerate(output) if _scalar(item)]
        if len(scalars) == 1:
            return ModelLoss(scalars[0])
    return None


@dataclass
class SeenStep:
    """What the probe needs, from the step seen: the batch and its size, and either a
    ``probe_step`` or a ``loss_fn`` (or why not)."""

    batch: Any = None
    size: int = 0
    probe_step: Callable[[nn.Module, Any], torch.Tensor] | None = None
    loss_fn: nn.Module | None = None
    why_not: str | None = None


class StepWatch:
    """Sees one training step of ``model`` through a global module forward hook, then removes
    it and calls ``done`` with what the probe can use."""

    def __init__(self, model: nn.Module, done: Callable[[SeenStep], None]) -> None:
        self._model = model
        self._done = done
        self._inputs: tuple[tuple, dict] | None = None
        self._output_id: int | None = None
        self._handle = register_module_forward_hook(self._after, with_kwargs=True)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _after(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if module is self._model and torch.is_grad_enabled() and module.training:
            if self._inputs is not None:  # a second step, and no loss module was seen
                self._finish(SeenStep(why_not=NOT_REPRODUCIBLE))
                return
            self._inputs = (args, dict(kwargs))
            if (step := model_loss(output)) is not None:
                self._finish(self._seen(step))
            else:
                self._output_id = id(output)  # not the output: it holds the step's graph
        elif (
            self._output_id is not None
            and isinstance(module, nn.modules.loss._Loss)
            and len(args) >= 2
            and id(args[0]) == self._output_id
            and self._inputs is not None
            and len(self._inputs[0]) == 1
            and not self._inputs[1]
        ):
            size = batch_length(self._inputs[0][0])
            batch = (self._inputs[0][0], args[1])
            self._finish(SeenStep(batch=batch, size=size or 0, loss_fn=module))

    def _seen(self, probe_step: ModelLoss) -> SeenStep:
        assert self._inputs is not None
        size = batch_length(self._inputs[0]) or batch_length(self._inputs[1])
        if not size:
            return SeenStep(why_not="bsmon run: the model's inputs have no batch dimension")
        return SeenStep(batch=self._inputs, size=size, probe_step=probe_step)

    def _finish(self, seen: SeenStep) -> None:
        self.close()
        self._inputs, self._output_id = None, None
        self._done(seen)
