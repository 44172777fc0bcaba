"""The agent thread's side: one step's marks turned into seconds per phase.

A step runs from the previous step's end (``begin``) to its own optimizer post-hook (``end``):

- data: the host seconds spent inside ``DataLoader.__next__`` for the step's training
  batches (None when no DataLoader batch was seen: the job makes its batches itself);
- forward: before each backward pass, from the later of the previous pass's end (or the step's
  start) and the last batch's arrival, to the pass's start — the forward pass and the loss;
- backward: each backward pass, start to end;
- optimizer: the optimizer step, less the forward and backward passes run inside it (a
  closure: LBFGS, Lightning's automatic optimization);
- other: the rest of the step's training time (logging, clipping, ``zero_grad``, host syncs;
  evaluation is already out of the step's time);
- comm (FSDP2): the calls that waited for its all-gathers and reduce-scatters
  (``collectives``), each taken out of the phase it ran in: backward when it started inside
  a backward pass, forward otherwise. (DDP's all-reduce wait comes later: ``with_comm``.)
  Beside it, ``comm_total``: the collective calls' own time, hidden or not (None: not seen).

Phases are clipped so that they never add up to more than the step: a host-timed phase may
overlap a device-timed one by a few microseconds, and work the hooks cannot tell from the
forward pass (an evaluation loop without a DataLoader) is taken out of the forward.
"""

from __future__ import annotations

from ..runtime.timing import CudaMark, Mark, elapsed
from .collectives import CommMark
from .marks import PassMarks, StepMarks
from .seconds import Phases


def phases_of(marks: StepMarks, begin: Mark | None, end: Mark, training_s: float) -> Phases | None:
    """The step's phases (None: nothing to split: no backward pass, or no start)."""
    if begin is None or not marks.passes:
        return None
    forward = backward = inside_optimizer = 0.0
    cursor = begin
    for one in marks.passes:
        gap = _seconds(one.batch if one.batch is not None else cursor, one.start)
        run = _seconds(one.start, one.end)
        forward += gap
        backward += run
        if marks.optimizer_t is not None and one.start_t >= marks.optimizer_t:
            inside_optimizer += gap + run
        cursor = one.end
    optimizer = None
    if marks.optimizer is not None:
        optimizer = max(0.0, _seconds(marks.optimizer, end) - inside_optimizer)
    comm = total = None
    if marks.comm:
        in_forward, in_backward = _comm_seconds(marks)
        in_forward, in_backward = min(in_forward, forward), min(in_backward, backward)
        forward, backward = forward - in_forward, backward - in_backward
        comm = in_forward + in_backward
        total = _total_seconds(marks.comm_ops)
    data = marks.data_s if marks.batches else None
    known = (data or 0.0) + forward + backward + (optimizer or 0.0) + (comm or 0.0)
    excess = known - training_s
    if excess > 0:
        taken = min(forward, excess)
        forward -= taken
        excess -= taken
        if excess > 0 and data is not None:
            data = max(0.0, data - excess)
        return Phases(data, forward, backward, optimizer, 0.0, comm, total)
    return Phases(data, forward, backward, optimizer, -excess, comm, total)


def _total_seconds(ops: tuple[CommMark, ...]) -> float | None:
    """The collective calls' seconds (None: none seen, or one not yet complete on a GPU)."""
    if not ops:
        return None
    total = 0.0
    for op in ops:
        if isinstance(op.end, CudaMark) and not op.end.event.query():
            return None  # on a stream the step's end did not wait for
        total += _seconds(op.start, op.end)
    return total


def _comm_seconds(marks: StepMarks) -> tuple[float, float]:
    """The seconds of FSDP2's collective calls in the forward and in the backward passes."""
    forward = backward = 0.0
    for call in marks.comm:
        seconds = _seconds(call.start, call.end)
        if any(_inside(call.start_t, one) for one in marks.passes):
            backward += seconds
        else:
            forward += seconds
    return forward, backward


def _inside(host_t: float, one: PassMarks) -> bool:
    end = one.end.host_time if isinstance(one.end, CudaMark) else one.end
    return one.start_t <= host_t <= end


def _seconds(start: Mark, end: Mark) -> float:
    return max(0.0, elapsed(start, end) or 0.0)


def with_comm(phases: Phases, comm_s: float | None) -> Phases:
    """The all-reduce wait DDP last measured (it samples every few steps) taken out of the
    backward pass it is part of (a step whose collectives were timed keeps its own)."""
    if comm_s is None or phases.comm is not None:
        return phases
    comm = min(comm_s, phases.backward)
    return phases._replace(backward=phases.backward - comm, comm=comm)
