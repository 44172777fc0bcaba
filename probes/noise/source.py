"""The base of every measurement source: what all of them do on the training thread.

A source installs hooks, gathers one optimizer step's squared norms as device tensors, and at
the optimizer's pre-step hook turns them into a ``StepRecord`` (no value is read there).
Every hook body runs inside ``FaultGuard``: an exception is counted, reported once as an
event, marks the step unusable, and never reaches the training loop.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar

from torch import Tensor

from ..runtime.fault_guard import FaultGuard
from .autograd import BackwardEnd, ExampleCounter, total_squared_norm
from .scaling import AdamPreconditioner, LossScale
from .step_record import StepRecord, capture
from .tracker import BELOW_ZERO

Emit = Callable[[str, str], None]  # (message, level)
Body = TypeVar("Body", bound=Callable[..., Any])


def hook(where: str) -> Callable[[Body], Body]:
    """Decorates the body of a source's hook: skipped while the source is not measuring, its
    host time counted against the cost budget, an exception reported (and the step spoilt),
    never raised into the training loop."""

    def decorate(body: Body) -> Body:
        @functools.wraps(body)
        def run(self: Source, *args: Any) -> Any:
            if not self.active:
                return None
            start = time.perf_counter()
            try:
                return body(self, *args)
            except Exception as exc:
                self.report(where, exc)
                return None
            finally:
                self.cost += time.perf_counter() - start

        return run  # type: ignore[return-value]

    return decorate


class Source:
    estimator = ""
    biased = False
    # the controller sees only the measured steps, each armed at the boundary before it (the
    # others cost the training thread nothing); else it sees every step
    skips_unmeasured_steps = False

    def __init__(
        self,
        params: list[Tensor],
        *,
        guard: FaultGuard,
        loss_scale: LossScale,
        precond: AdamPreconditioner | None,
        emit: Emit,
        world: int = 1,
        counter: ExampleCounter | None = None,
    ) -> None:
        self.params = params
        self.counter = counter  # the examples of each pass, for sources without per-example hooks
        self.guard = guard
        self.loss_scale = loss_scale
        self.precond = precond
        self.emit = emit
        self.world = world
        self.coverage = 1.0
        self.closed = False
        self.measuring = True  # whether this step is measured (the controller's budget decides)
        self.active = True  # not closed and measuring: the one flag hooks test first
        self.cost = 0.0  # seconds spent in this source's hooks on the training thread this step
        self.always_measure = False  # a source that needs every step (sequential)
        self.backwards = 0  # backward passes in the step being gathered
        self.last_backwards = 0  # in the previous step
        self._end = BackwardEnd(self._backward_end_timed, guard, relay=world > 1)
        self._total: Tensor | None = None
        self._scale: Tensor | None = None
        self._problem: str | None = None
        self._gap = 1  # training steps since the previous measured one (take_record)

    # -- hooks ---------------------------------------------------------------------------------

    def report(self, where: str, exc: BaseException) -> None:
        """An exception in a hook: count it, and do not use this step."""
        self._problem = f"bsmon error in {where}"
        self.guard.report(f"noise scale: {where}", exc)

    def _on_backward_end(self) -> None:
        """Runs after each backward pass (subclasses add their per-pass work)."""
        self.backwards += 1
        self._measure_total()

    def _backward_end_timed(self) -> None:
        start = time.perf_counter()
        try:
            self._on_backward_end()
        finally:
            self.cost += time.perf_counter() - start

    def _measure_total(self) -> None:
        """|p.grad|² over the measured parameters, now: after the backward pass (and after DDP
        averaged), before any clipping; carries the loss scale, divided out later."""
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            self._total = None
            return
        w2 = (
            [self.precond.w2(p) for p in self.params if p.grad is not None]
            if self.precond
            else None
        )
        if w2 is not None and any(w is None for w in w2):
            self._problem = "Adam state not initialised yet (first step)"
            w2 = None
        self._total = total_squared_norm(grads, w2)  # type: ignore[arg-type]
        self._scale = self.loss_scale.current(self._total.device)

    # -- step ----------------------------------------------------------------------------------

    def set_measuring(self, measuring: bool) -> None:
        self.measuring = measuring or self.always_measure
        self.active = self.measuring and not self.closed
        if self.counter is not None:
            self.counter.want(self.active)

    def take_record(self, step: int, gap: int = 1) -> StepRecord | None:
        """At the optimizer's pre-step hook: this step's record (None if nothing to report);
        ``gap``: training steps since the previous measured one."""
        self._gap = gap
        start = time.perf_counter()
        self._end.reset()  # a backward pass that raised left its callback unrun
        record = None
        if self.backwards and not self.closed:
            record = self._record(step)
        self.last_backwards = self.backwards
        self.backwards = 0
        self._total = self._scale = None
        self._problem = None
        self._clear()
        if self.precond is not None:
            self.precond.new_step()
        self.cost += time.perf_counter() - start
        return record

    def take_examples(self) -> int:
        """Examples of the model's forward passes since the last take (0: not counted)."""
        return self.counter.take() if self.counter is not None else 0

    def take_cost(self) -> float:
        cost, self.cost = self.cost, 0.0
        return cost

    def _record(self, step: int) -> StepRecord | None:
        raise NotImplementedError

    def _clear(self) -> None:
        """Forget the per-step gathering of the subclass."""

    def _make(
        self,
        step: int,
        values: list[Tensor],
        examples: float,
        units: tuple[tuple[int, float, float], ...],
        **extra: Any,
    ) -> StepRecord | None:
        if self._total is None or self._scale is None:
            return None
        return StepRecord(
            step=step,
            estimator=self.estimator,
            values=capture([self._total, self._scale, *values]),
            examples=examples,
            units=units,
            problem=self._problem,
            gap=self._gap,
            **extra,
        )

    # -- description ---------------------------------------------------------------------------

    def detail(self) -> str:
        return ""

    def below_zero(self) -> str:
        """Why |G|² can read below zero beyond its error with this source."""
        return BELOW_ZERO

    def close(self) -> None:
        self.closed = True
        self.active = False
        if self.counter is not None:
            self.counter.want(False)
