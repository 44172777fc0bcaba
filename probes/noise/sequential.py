"""``sequential``: consecutive steps' gradients as the two small batches — biased, for comparison.

This is the fastai batch-size finder's method (and AdaptDL's single-replica fallback) with
two steps: the gradients of two consecutive steps, each of B examples, against their mean as
a batch of 2B. The two gradients are taken at different parameters — an update happened in
between — so the |G|² estimate is biased low by the factor (1 − ε/ε_opt) and can be negative at
a well-tuned learning rate (research note §6.3). bsmon marks it ``biased`` everywhere.

The pairs do not overlap (steps 1–2, 3–4, ...): overlapping pairs share a gradient, which
makes consecutive estimates correlated and the reported standard error too small (by about
1.2× at lr 0, measured over 16 seeds); with each gradient used once the error is right.

Cost: two gradient copies (the previous step's and the latest pass's), unscaled and (with the
Adam option) preconditioned, taken after each backward pass so clipping cannot touch them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .autograd import ExampleCounter, accumulates, grad_accumulator, total_squared_norm
from .source import Source, hook
from .step_record import StepRecord


class SequentialSource(Source):
    estimator = "sequential"
    biased = True

    def __init__(
        self,
        trainable: list[Tensor],
        counter: ExampleCounter,
        examples_hint: Callable[[], int | None],
        **kwargs: Any,
    ) -> None:
        super().__init__(trainable, counter=counter, **kwargs)
        self.always_measure = True  # pairs of consecutive steps
        self._examples_hint = examples_hint
        # a gradient arriving at any parameter tells bsmon a backward pass is under way, so
        # the end-of-pass callback is queued (nothing is registered on the model)
        self._accumulators = [grad_accumulator(p) for p in trainable]
        self._handles = [
            p.register_hook(functools.partial(self._touch, accumulator))
            for p, accumulator in zip(trainable, self._accumulators, strict=True)
        ]
        self._current: tuple[tuple[bool, ...], list[Tensor]] | None = None
        self._previous: tuple[tuple[bool, ...], list[Tensor], int] | None = None
        self._current_sq: Tensor | None = None
        self._previous_sq: Tensor | None = None
        self.set_measuring(True)

    @hook("sequential gradient hook")
    def _touch(self, accumulator: Any, _grad: Tensor) -> None:
        if not self._end.pending and accumulates(accumulator):
            self._end.touch()

    def _on_backward_end(self) -> None:
        super()._on_backward_end()
        if self._scale is None:
            return
        present = tuple(p.grad is not None for p in self.params)
        grads = [p.grad.detach() for p in self.params if p.grad is not None]  # type: ignore[union-attr]
        copies = torch._foreach_div([g.to(torch.float32) for g in grads], self._scale.float())
        if self.precond is not None:
            w2 = [self.precond.w2(p) for p in self.params if p.grad is not None]
            if any(w is None for w in w2):
                self._problem = "Adam state not initialised yet (first step)"
            else:
                torch._foreach_mul_(copies, [w.sqrt() for w in w2])  # type: ignore[union-attr]
        self._current = (present, copies)
        self._current_sq = total_squared_norm(copies)

    def _record(self, step: int) -> StepRecord | None:
        current, current_sq = self._current, self._current_sq
        if current is None or current_sq is None:
            return None
        # under DDP the gradient is the average over the ranks: W times the local examples
        examples = (self.take_examples() or self._examples_hint() or 0) * self.world
        previous, previous_sq = self._previous, self._previous_sq
        self._previous, self._previous_sq = (*current, examples), current_sq
        if previous is None or previous_sq is None:
            return None
        present, copies, prev_examples = previous
        if present != current[0] or examples != prev_examples or not examples:
            return None  # different parameters or batch sizes: no pair this step
        self._previous = self._previous_sq = None  # the next pair starts afresh
        diff_sq = total_squared_norm(torch._foreach_sub(current[1], copies))
        # the two gradients are already unscaled: the record's scale is 1
        self._scale = self.loss_scale.one(current_sq.device)
        self._total, unit_sq = pair_terms(previous_sq, current_sq, diff_sq)
        return self._make(
            step, [unit_sq], examples=2 * examples, units=((2, float(examples), 1.0),)
        )

    def _clear(self) -> None:
        self.take_examples()  # forward passes not followed by a backward pass in this step
        self._current = None
        self._current_sq = None

    def detail(self) -> str:
        return "consecutive steps (biased: an update lies between them)"

    def close(self) -> None:
        super().close()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._previous = None


def pair_terms(prev_sq: Any, cur_sq: Any, diff_sq: Any) -> tuple[Any, Any]:
    """Two equal steps' gradients g₁, g₂ as the units of one big batch (floats or tensors):
    the big batch's squared norm |(g₁ + g₂)/2|² = (2|g₁|² + 2|g₂|² − |g₁ − g₂|²)/4 and the
    units' Σ|c_u|² with c_u = g_u/2."""
    return (2 * prev_sq + 2 * cur_sq - diff_sq) / 4, (prev_sq + cur_sq) / 4
