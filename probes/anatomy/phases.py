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
  evaluation is already out of the step's time).

Phases are clipped so that they never add up to more than the step: a host-timed phase may
overlap a device-timed one by a few microseconds, and work the hooks cannot tell from the
forward pass (an evaluation loop without a DataLoader) is taken out of the forward.
"""

from __future__ import annotations

from ..runtime.timing import Mark, elapsed
from .marks import StepMarks
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
    data = marks.data_s if marks.batches else None
    known = (data or 0.0) + forward + backward + (optimizer or 0.0)
    excess = known - training_s
    if excess > 0:
        taken = min(forward, excess)
        forward -= taken
        excess -= taken
        if excess > 0 and data is not None:
            data = max(0.0, data - excess)
        return Phases(data, forward, backward, optimizer, 0.0)
    return Phases(data, forward, backward, optimizer, -excess)


def _seconds(start: Mark, end: Mark) -> float:
    return max(0.0, elapsed(start, end) or 0.0)


def with_comm(phases: Phases, comm_s: float | None) -> Phases:
    """The all-reduce wait DDP last measured (it samples every few steps) taken out of the
    backward pass it is part of."""
    if comm_s is None:
        return phases
    comm = min(comm_s, phases.backward)
    return phases._replace(backward=phases.backward - comm, comm=comm)
