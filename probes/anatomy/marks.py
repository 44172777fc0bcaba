"""The training thread's side: the boundaries of a sampled step's phases, O(1) per signal.

The anatomy measures a sample of steps (``sampling``: one step in every 4 to 12, fewer on
very fast steps, drawn at random so that no periodic pattern of the job aliases with it); the
shares of a window of sampled steps are the shares of the run. Off the sampled steps nothing
here runs: the backward wrapper is installed when a sampled step is about to start (``arm``)
and removed after it (``disarm``).

Four signals mark a sampled step: a training batch arriving from a DataLoader
(``loader_watch``), a backward pass starting and ending (``torch.autograd.backward`` wrapped
while armed: ``loss.backward()`` goes through it), and the optimizer step starting (its
pre-hook). The step runs from the previous step's end (``arm``) to its own post-hook
(``take``). Each boundary is a timing mark (``timing.StepClock``): a ``perf_counter`` reading
on a CPU, a CUDA event recorded on the current stream on a GPU, so the phases come out in
device time there without the training thread ever waiting.

Only the training thread's signals count (the thread that steps the optimizer): a backward
pass run by another thread is someone else's. Under FSDP2 a fifth signal, the calls that wait
for its collectives (``collectives``), is armed and disarmed with the others.
"""

from __future__ import annotations

import threading
import time
from typing import Any, NamedTuple

import torch

from ..runtime.call_watch import CallWatch
from ..runtime.timing import Mark, StepClock
from .collectives import CollectiveMarks, CommMark

backward_calls = CallWatch(lambda: (torch.autograd, "backward"))


class PassMarks(NamedTuple):
    """One backward pass and the forward before it."""

    batch: Mark | None  # the last training batch that arrived since the previous pass
    start: Mark
    end: Mark
    start_t: float  # host time of the start (ordering against the optimizer step)


class StepMarks(NamedTuple):
    """One sampled step's boundaries, handed to the agent thread with the step."""

    passes: tuple[PassMarks, ...]
    optimizer: Mark | None  # the optimizer step's start
    optimizer_t: float | None
    data_s: float  # host seconds inside DataLoader.__next__ for this step's training batches
    batches: int  # training batches drawn from a DataLoader in this step
    begin: Mark | None = None  # the previous step's end
    end: Mark | None = None  # this step's end
    comm: tuple[CommMark, ...] = ()  # FSDP2's calls that waited for its collectives
    comm_ops: tuple[CommMark, ...] = ()  # the collective calls inside them


class PhaseMarks:
    """Collects one step's marks at a time (training thread)."""

    def __init__(self, clock: StepClock, collectives: CollectiveMarks | None = None) -> None:
        self._clock = clock
        self.collectives = collectives  # an FSDP2 job's; None: no collectives of its own
        self.armed = False
        self._begin: Mark | None = None
        self._thread: int | None = None
        self._passes: list[PassMarks] = []
        self._batch: Mark | None = None
        self._data_s = 0.0
        self._batches = 0
        self._optimizer: Mark | None = None
        self._optimizer_t: float | None = None
        self._pending_start: Mark | None = None
        self.installed = False
        self.why_not: str | None = None  # why backward passes are not seen

    def install(self) -> None:
        """Find out whether backward passes can be seen (the wrapper goes in at ``arm``)."""
        self.why_not = backward_calls.why_not()
        self.installed = self.why_not is None
        if self.collectives is not None:
            self.collectives.install()

    def remove(self) -> None:
        self.disarm()
        self.installed = False

    def arm(self, now: float) -> None:
        """The next step is sampled: it begins ``now`` (the step that just ended)."""
        if not self.armed and self.installed:
            starting = self._backward_starting if self._clock.device is not None else None
            self.why_not = backward_calls.subscribe(self._backward, starting)
            self.armed = self.why_not is None
            if self.armed and self.collectives is not None:
                self.collectives.arm()
        self.take(now)  # forget what came between the steps
        self._begin = self._clock.mark(now)

    def disarm(self) -> None:
        if self.armed:
            starting = self._backward_starting if self._clock.device is not None else None
            backward_calls.unsubscribe(self._backward, starting)
            self.armed = False
        if self.collectives is not None:
            self.collectives.disarm()

    def batch(self, start: float, end: float) -> None:
        """A training batch arrived (its ``__next__`` ran from ``start`` to ``end``)."""
        self._data_s += end - start
        self._batches += 1
        self._batch = self._clock.mark(end)

    def optimizer_starting(self, now: float) -> None:
        self._thread = threading.get_ident()
        self._optimizer_t = now
        self._optimizer = self._clock.mark(now)

    def take(self, now: float | None = None) -> StepMarks:
        """The sampled step that just ended (``now``); the next one starts empty."""
        comm, ops = self.collectives.take() if self.collectives is not None else ((), ())
        marks = StepMarks(
            tuple(self._passes),
            self._optimizer,
            self._optimizer_t,
            self._data_s,
            self._batches,
            self._begin,
            self._clock.mark(now) if now is not None else None,
            comm,
            ops,
        )
        self._passes = []
        self._batch = self._optimizer = self._optimizer_t = self._begin = None
        self._data_s = 0.0
        self._batches = 0
        return marks

    def discard(self) -> None:
        """Forget the step so far (it will run again: the OOM guard)."""
        self.take()

    def _own_thread(self) -> bool:
        return self._thread is None or self._thread == threading.get_ident()

    def _backward_starting(self) -> None:
        if self._own_thread():
            self._pending_start = self._clock.mark(time.perf_counter())

    def _backward(self, _tensors: Any, _result: Any, start: float, end: float) -> None:
        if not self._own_thread():
            return
        pending, self._pending_start = self._pending_start, None
        self._passes.append(PassMarks(self._batch, pending or start, self._clock.mark(end), start))
        self._batch = None
