"""Training-thread plumbing shared by the estimators: the end of a backward pass, squared
gradient norms that stay on the device, and the count of examples per forward pass."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..runtime.fault_guard import FaultGuard
from ..runtime.forward_watch import ForwardWatch, RootPass

_engine = torch.autograd.Variable._execution_engine  # type: ignore[attr-defined]


class BackwardEnd:
    """Calls ``callback`` once at the end of every backward pass in which ``touch()`` was called
    (from a hook that fired during that pass).

    With ``relay`` the callback is queued from a callback, so it runs after the callbacks that
    others queue later in the same pass — DistributedDataParallel's finalisation, which writes
    the averaged gradients into ``p.grad``, among them (AdaptDL relies on the same ordering).
    On one device there is none to wait for, and the callback is queued directly."""

    def __init__(self, callback: Callable[[], None], guard: FaultGuard, relay: bool = True) -> None:
        self._callback = callback
        self._guard = guard
        self._first = self._relay if relay else self._fire
        self.pending = False

    def touch(self) -> None:
        if not self.pending:
            self.pending = True
            _engine.queue_callback(self._first)

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
    if w2 is None and not any(g.is_sparse for g in grads):
        norms = torch._foreach_norm(grads, 2, dtype=torch.float32)
    else:
        weights = w2 if w2 is not None else [None] * len(grads)
        norms = [squared_norm(g, w).sqrt() for g, w in zip(grads, weights, strict=True)]
    device = norms[0].device
    try:
        stacked = torch.stack(norms)  # one device, as a rule: no copy per parameter
    except RuntimeError:  # parameters on several devices
        stacked = torch.stack([n.to(device) for n in norms])
    return torch.dot(stacked, stacked)


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
    """Counts the examples of the model's forward passes run with gradients, as the forward
    watch reports them, so estimators without per-example hooks know how many examples each
    backward pass covered. It holds the watch only while ``want(True)`` (measured steps) and
    only for jobs whose batches are not known otherwise."""

    def __init__(
        self, watch: ForwardWatch, holder: str, known: Callable[[], bool] = lambda: False
    ) -> None:
        self._watch = watch
        self._holder = holder
        self._known = known  # the job says its batches itself: no forward hook is needed
        self.pending = 0
        self.largest = 0  # the largest single pass among them
        self.wanted = False  # the last want(): read by the hot path, which calls want() on change
        watch.on_root(self._count)

    def want(self, counting: bool) -> None:
        """Count the next step's examples; only when the job does not say them itself (a
        DataLoader, a declared batch size), for the forward hook makes every call dearer."""
        if counting and not self.wanted:
            self.pending = self.largest = 0  # passes seen for other holders do not count
        self.wanted = counting
        if counting and not self._known():
            self._watch.hold(self._holder)
        else:
            self._watch.release(self._holder)

    def _count(self, root_pass: RootPass, _output: Any) -> None:
        if root_pass.grad:
            examples = root_pass.examples or 0
            self.pending += examples
            self.largest = max(self.largest, examples)

    def take(self, one_batch: bool = False) -> int:
        """The examples since the last take; ``one_batch``: the passes re-evaluated one
        batch (a closure step), so its largest pass."""
        n = self.largest if one_batch else self.pending
        self.pending = self.largest = 0
        return n

    def remove(self) -> None:
        self._watch.release(self._holder)
        self._watch.off_root(self._count)
