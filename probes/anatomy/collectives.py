"""FSDP2's collectives on the anatomy's sampled steps: how long the step waits for them.

``fully_shard`` runs its collectives from four methods of each parameter group
(``FSDPParamGroup`` in ``torch.distributed.fsdp._fully_shard._fsdp_param_group``):
``unshard`` starts a group's all-gather (with gloo on a CPU it runs it, blocking),
``wait_for_unshard`` waits for it and copies the parameters out, ``post_backward`` copies the
gradients in and starts the reduce-scatter (waiting for the previous one's result first), and
``finalize_backward`` waits for the last. None of the four calls another, and FSDP calls them
by name on the group each time, so wrapping them on the class (``CallWatch``) sees every call
once. The time inside them is the step's exposed collective time: on a CPU host time; on a GPU
the current stream's time between a CUDA event before and one after — what that stream waited
for the collective streams, with the copies in and out.

The collectives' own time, exposed or hidden, is that of the collective calls FSDP2 makes
inside those methods (``torch.distributed.all_gather_single`` and ``reduce_scatter_single``;
``all_gather_into_tensor`` and ``reduce_scatter_tensor`` in a torch without them), wrapped
the same way and counted only inside the four (so that the job's own collectives are not
FSDP2's): host time on a CPU, where gloo's collectives block, so none of it hides; on a GPU
two CUDA events on the stream they run on. Their total less the exposed wait is the part
hidden behind compute (at least: the exposed wait includes the copies).

A pre- or post-backward hook may run on the autograd engine's thread rather than the training
thread (on a GPU it does), so every thread's calls count; they never overlap, as the training
thread waits for the backward pass to end. The wrappers are in only while a sampled step runs
(``arm`` to ``disarm``). A torch whose FSDP2 names these methods otherwise is not wrapped: the
comm phase is then "not measured" with that reason; one whose collectives are not found, or
not called from them, leaves only their total unmeasured.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import torch

from ..runtime.call_watch import CallWatch, Locate
from ..runtime.timing import Mark, StepClock

METHODS = ("unshard", "wait_for_unshard", "post_backward", "finalize_backward")


def _locate(name: str) -> Locate:
    def locate() -> tuple[Any, str] | str:
        try:
            from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
        except Exception as exc:  # a torch without FSDP2, or with it elsewhere
            return f"FSDP2's parameter groups are not where bsmon looks ({type(exc).__name__})"
        if not callable(getattr(FSDPParamGroup, name, None)):
            return f"torch {torch.__version__}'s FSDP2 parameter groups have no {name}()"
        return FSDPParamGroup, name

    return locate


WATCHES = tuple(CallWatch(_locate(name)) for name in METHODS)


def _locate_collective(*names: str) -> Locate:
    def locate() -> tuple[Any, str] | str:
        import torch.distributed as dist

        found = next((name for name in names if callable(getattr(dist, name, None))), None)
        return (dist, found) if found else f"torch.distributed has no {names[0]}()"

    return locate


COLLECTIVES = (
    CallWatch(_locate_collective("all_gather_single", "all_gather_into_tensor")),
    CallWatch(_locate_collective("reduce_scatter_single", "reduce_scatter_tensor")),
)


class CommMark(NamedTuple):
    """One call of FSDP2's that waits for a collective (or starts it and, on gloo, runs it)."""

    start: Mark
    end: Mark
    start_t: float  # host time of the start (in a backward pass or not)


class CollectiveMarks:
    """Collects the sampled step's FSDP2 calls that wait for collectives, and the collective
    calls inside them (training and autograd threads)."""

    def __init__(self, clock: StepClock) -> None:
        self._clock = clock
        self._marks: list[CommMark] = []
        self._ops: list[CommMark] = []
        self._pending: Mark | None = None
        self._op_pending: Mark | None = None
        self._inside = False  # in one of FSDP2's four methods
        self.armed = False
        self.why_not: str | None = None  # why FSDP2's collectives are not seen

    def install(self) -> None:
        """Find out whether FSDP2's calls can be seen (the wrappers go in at ``arm``)."""
        self.why_not = next((why for w in WATCHES if (why := w.why_not()) is not None), None)

    def arm(self) -> None:
        if self.armed or self.why_not is not None:
            return
        self.armed = True
        for watch in WATCHES:
            why = watch.subscribe(self._called, self._starting)
            if why is not None:
                self.why_not = why
                self.disarm()
                return
        for watch in COLLECTIVES:  # where one is missing, only the total goes unmeasured
            watch.subscribe(self._op_called, self._op_starting)

    def disarm(self) -> None:
        if not self.armed:
            return
        for watch in WATCHES:
            watch.unsubscribe(self._called, self._starting)
        for watch in COLLECTIVES:
            watch.unsubscribe(self._op_called, self._op_starting)
        self.armed = False
        self._inside = False

    def take(self) -> tuple[tuple[CommMark, ...], tuple[CommMark, ...]]:
        """The step's waiting calls and the collective calls inside them."""
        marks, ops = tuple(self._marks), tuple(self._ops)
        self._marks, self._ops = [], []
        self._inside = False  # none of FSDP2's methods runs between steps (one that raised)
        return marks, ops

    def _starting(self) -> None:
        self._inside = True
        if self._clock.device is not None:
            self._pending = self._clock.mark(time.perf_counter())

    def _called(self, _group: Any, _result: Any, start: float, end: float) -> None:
        self._inside = False
        pending, self._pending = self._pending, None
        self._marks.append(CommMark(pending or start, self._clock.mark(end), start))

    def _op_starting(self) -> None:
        if self._inside and self._clock.device is not None:
            self._op_pending = self._clock.mark(time.perf_counter())  # on the collective's stream

    def _op_called(self, _output: Any, _result: Any, start: float, end: float) -> None:
        if not self._inside:
            return  # the job's own collective, not FSDP2's
        pending, self._op_pending = self._op_pending, None
        self._ops.append(CommMark(pending or start, self._clock.mark(end), start))
