"""Training-thread plumbing shared by the estimators: the end of a backward pass, squared
gradient norms that stay on the device, and the count of examples per forward pass."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..data import batch_length
from ..safety import FaultGuard

_engine = torch.autograd.Variable._execution_engine  # type: ignore[attr-defined]


class BackwardEnd:
    """Calls ``callback`` once at the end of every backward pass in which ``touch()`` was called
    (from a hook that fired during that pass).

    The callback is queued from a callback, so it runs after the callbacks that others queue
    later in the same pass — DistributedDataParallel's finalisation, which writes the averaged
    gradients into ``p.grad``, among them (AdaptDL relies on the same ordering)."""

    def __init__(self, callback: Callable[[], None], guard: FaultGuard) -> None:
        self._callback = callback
        self._guard = guard
        self.pending = False

    def touch(self) -> None:
        if not self.pending:
            self.pending = True
            _engine.queue_callback(self._relay)

    def reset(self) -> None:
        """A backward pass that raised never ran its callbacks: start afresh (at a step)."""
        self.pending = False

    def _relay(self) -> None:
        try:
            _engine.queue_callback(self._fire)
        except Exception as exc:
            self.pending = False
            self._guard.report("noise scale: end of backward", exc)

    def _fire(self) -> None:
        self.pending = False
        try:
            self._callback()
        except Exception as exc:
            self._guard.report("noise scale: end of backward", exc)


def dense(grad: Tensor) -> Tensor:
    """The stored values of a gradient (a sparse one is coalesced: duplicates summed first)."""
    return grad.coalesce().values() if grad.is_sparse else grad


def squared_norm(t: Tensor, w2: Tensor | None = None) -> Tensor:
    """Σ t² (or Σ w2·t²) as a 0-dim float32 (float64 for float64 input) tensor on t's device."""
    t = dense(t).detach()
    if t.dtype not in (torch.float32, torch.float64):
        t = t.float()
    t2 = t.square()
    if w2 is not None:
        t2 = t2 * w2.to(t2.dtype)
    return t2.sum()


def total_squared_norm(grads: list[Tensor], w2: list[Tensor | None] | None = None) -> Tensor:
    """Σ over tensors of their squared norms, without leaving the device."""
    if w2 is None and all(not g.is_sparse for g in grads):
        norms = torch._foreach_norm(grads, 2, dtype=torch.float32)
    else:
        weights = w2 if w2 is not None else [None] * len(grads)
        norms = [squared_norm(g, w).sqrt() for g, w in zip(grads, weights, strict=True)]
    device = norms[0].device
    return torch.stack([n.to(device) for n in norms]).square().sum()


def grad_accumulator(param: Tensor) -> Any:
    """The autograd node that adds into ``param.grad`` (held, so it stays the same node)."""
    return param.view_as(param).grad_fn.next_functions[0][0]  # type: ignore[union-attr]


def accumulates(node: Any) -> bool:
    """Inside a hook: whether the running backward pass adds into the gradient behind
    ``node``. False inside ``torch.autograd.grad`` (e.g. a gradient penalty) and for
    ``backward(inputs=...)`` that leaves the parameter out: those passes are not training
    gradients and must not be measured."""
    try:
        return bool(torch._C._will_engine_execute_node(node))
    except RuntimeError:  # torch refuses to answer for a leaf during autograd.grad()
        return False


class ExampleCounter:
    """Counts the examples (dim 0 of the first tensor argument) of each forward pass of the
    root model run with gradients enabled, so estimators without per-example hooks know how
    many examples each backward pass covered."""

    def __init__(self, model: torch.nn.Module | None, guard: FaultGuard) -> None:
        self._guard = guard
        self.pending = 0
        self._handle = (
            model.register_forward_pre_hook(self._count, with_kwargs=True)
            if model is not None
            else None
        )

    def _count(self, _module: Any, args: tuple, kwargs: dict) -> None:
        try:
            if torch.is_grad_enabled():
                n = batch_length(args[0] if args else kwargs)
                self.pending += n or 0
        except Exception as exc:
            self._guard.report("noise scale: counting examples", exc)

    def take(self) -> int:
        n, self.pending = self.pending, 0
        return n

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
