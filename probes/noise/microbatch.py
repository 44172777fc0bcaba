"""Micro-batch norms under gradient accumulation (several backward passes per step).

A tensor hook on every trainable parameter sees the gradient each backward pass contributes
before it is added to ``p.grad``; its squared norm is summed on the device per pass. With k
passes of b_j examples and the step's gradient ḡ = Σ_j c_j, the micro-batches are the small
batches and the step the big one (eq. A.2 in the form of ``estimators.components``): unbiased,
whether or not the loss is divided by k, with no copy of any gradient (AdaptDL's method,
research note §2.3, §8.2). A step with a single backward pass has no small batch: it is
skipped with that reason.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..runtime.audience import examples_unknown
from .autograd import ExampleCounter, accumulates, grad_accumulator, squared_norm
from .source import Source, hook
from .step_record import StepRecord


class MicrobatchSource(Source):
    estimator = "microbatch"

    def __init__(
        self,
        trainable: list[Tensor],
        counter: ExampleCounter,
        examples_hint: Callable[[], int | None],
        pass_hint: Callable[[], int | None] = lambda: None,
        **kwargs: Any,
    ) -> None:
        super().__init__(trainable, counter=counter, **kwargs)
        self._examples_hint = examples_hint
        self._pass_hint = pass_hint  # the batch the job drew last: this pass's examples
        self._accumulators = {id(p): grad_accumulator(p) for p in trainable}
        self._handles: list[Any] = []
        self.set_counting(True)
        self._pending: list[Tensor] = []  # this backward pass
        self._units: list[tuple[Tensor, int]] = []  # this step: (Σ|c_j|², examples) per pass
        self.last_units = 0

    def set_counting(self, counting: bool) -> None:
        """The hooks on (the next step's passes are seen) or off (a step no one looks at
        costs nothing: while ``auto`` waits for the job to accumulate, it looks at one step in
        a few, the controller decides which)."""
        if counting and not self._handles and not self.closed:
            self._handles = [
                p.register_hook(functools.partial(self._on_grad, p)) for p in self.params
            ]
        elif not counting:
            for handle in self._handles:
                handle.remove()
            self._handles = []

    def _on_grad(self, param: Tensor, grad: Tensor) -> None:
        """Every backward pass is counted, measured or not (a step not measured costs one
        check per parameter): whether the job accumulates decides whether to measure."""
        if self.active:
            self._gradient(param, grad)
        elif not self._end.pending and not self.closed:
            try:
                if accumulates(self._accumulators[id(param)]):
                    self._end.touch()
            except Exception as exc:
                self.report("micro-batch pass count", exc)

    @hook("micro-batch gradient hook")
    def _gradient(self, param: Tensor, grad: Tensor) -> None:
        if not accumulates(self._accumulators[id(param)]):
            return  # torch.autograd.grad or backward(inputs=...): not a training gradient
        w2 = self.precond.w2(param) if self.precond is not None else None
        self._pending.append(squared_norm(grad, w2))
        self._end.touch()

    def _on_backward_end(self) -> None:
        if not self.active:
            self.backwards += 1  # counted, not measured
            return
        pending, self._pending = self._pending, []
        if not pending:
            return
        device = pending[0].device
        self._units.append(
            (
                torch.stack([t.to(device) for t in pending]).sum(),
                self.take_examples() or self._pass_hint() or 0,
            )
        )
        super()._on_backward_end()

    def _record(self, step: int) -> StepRecord | None:
        units = self._units
        if not units:
            return None
        sizes = [n for _, n in units]
        if not all(sizes):  # the forward passes could not be counted: share the declared batch
            hint = self._examples_hint() or 0
            sizes = [hint / len(units)] * len(units) if hint else sizes
        if len(units) < 2:
            self._problem = (
                "the micro-batch estimator needs gradient accumulation "
                "(2 or more backward passes per optimizer step)"
            )
        elif not all(sizes):
            self._problem = f"unknown micro-batch sizes ({examples_unknown()})"
        return self._make(
            step,
            [value for value, _ in units],
            examples=sum(sizes),
            units=tuple((1, float(n), 1.0) for n in sizes),
        )

    def _clear(self) -> None:
        if self._units:  # a step measured: its micro-batches (unmeasured ones have none)
            self.last_units = len(self._units)
        self.take_examples()  # forward passes not followed by a backward pass in this step
        self._pending = []
        self._units = []

    def detail(self) -> str:
        k = self.last_units
        return f"{k} micro-batches per step" if k > 1 else "waiting for gradient accumulation"

    def close(self) -> None:
        super().close()
        self.set_counting(False)
