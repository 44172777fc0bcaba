"""The training job's step count, and whether the step in progress is an ordinary one.

The optimizer's post-hook (``hot_path``) takes its short path on an ordinary step: the step's
end and batch size into the ring, nothing else. Whatever gives a step more to record clears
``quiet`` with one attribute store — a batch drawn or counted (``samples``), an evaluation
signal (``evaluation``), a micro-batch counted, a loader's batch kept for the OOM guard,
tensors the agent hands back — and the full path sets it again at a step's end when nothing
is left. A boundary (``HotPath.wake``) takes the full path whatever ``quiet`` says.
"""

from __future__ import annotations


class Progress:
    """Advanced at each step's end; the parts that stamp an event or a record with its step
    call it (``progress()`` is the current step)."""

    __slots__ = ("quiet", "step")

    def __init__(self) -> None:
        self.step = 0
        self.quiet = False  # the step in progress has nothing but its end to record

    def __call__(self) -> int:
        return self.step
