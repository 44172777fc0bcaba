"""The training thread's inbox: what it hands to the agent thread.

Nothing here takes a lock or reads a device; the agent thread drains it every tick
(``TICK_S``). On a host-bound step the agent thread's work per step is what the training
thread waits for (the two share the GIL), and the largest part of that work was not Python
but memory: the first touch, on the agent's core, of every object the training thread made
for a step (a step's tuple and floats read once cost 3× what they cost read again). So a
step is written as numbers into preallocated lists, and the records that do come every step
are taken a tick's worth at a time and read as columns (C loops):

- ``ring``: one slot per step (``StepRing``): its end, samples drawn, examples, batch size and
  evaluation time, written by the optimizer's post-hook (``hot_path``); the step anatomy's
  marks, on its sampled steps only, go to ``ring.marks``;
- ``logged``: the ``{name: value}`` of each ``mon.log`` call, or, on a loop that logs
  faster than the agent needs, ``latest``: each name's latest value (``logged.LoggedIntake``);
- ``losses``: the tensor ``backward()`` was called on (``bsmon run``), or ``(loss,)``: a
  framework's ``backward(loss)`` was given ``loss``, and the next tensor is its own; while
  ``log`` keeps only the latest values, ``latest_loss`` holds the latest tensor instead;
- ``records``: everything else, in order (an ``Event``, a ``Flush``, an extension's record
  such as a ``BatchChange``). ``Telemetry.drain`` takes it first, so a ``Flush`` is done only
  after every step before it.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, NamedTuple

from .samples import NOT_COUNTED

# The tick's period. The training thread waits for a tick through the GIL, and a tick costs
# a fixed part (the extensions, the metrics) plus a part a step that is dearer the fewer steps
# a tick brings (the steps' data comes off another core's cache): on a 160 µs step, 0.25 s
# ticks cost the job 300 ns a step with telemetry and 690 with the record, 0.1 s ones 630 and
# 1,110 (docs/benchmarks.md). 4 Hz is still faster than the dashboard redraws (1 s); a flush
# wakes the tick at once.
TICK_S = 0.25

CAPACITY = 1 << 16


@dataclass(frozen=True, slots=True)
class Flush:
    """Set ``done`` once everything before this record is processed and sent."""

    done: threading.Event


class StepColumns(NamedTuple):
    """Steps ``first`` to ``first + len(ends) - 1`` read off the ring, a list per field."""

    first: int
    ends: list[float]  # the post-hook's perf_counter
    drawn: list[int]  # samples from the job's batches (sources 1-2); 0: none
    first_batch: list[int]  # the first of those batches' size; 0: unknown
    examples: list[int]  # the model's examples (source 3), or NOT_COUNTED
    declared: list[int]  # the batch size batch control runs at; 0: no batch control
    eval_s: list[float]  # evaluation time inside the step


class StepRing:
    """Training thread: a step's numbers go to slot ``step % capacity`` of lists made once,
    then ``written`` says the step is complete. Agent thread: ``take`` reads the slots after
    the last step it read, copying each list's run at once. A slot is overwritten
    ``capacity`` steps later: an agent that falls that far behind loses the oldest steps, as
    the bounded deque this replaces dropped them, and ``lost`` counts them.

    The fields a step may not have (samples drawn, the model's examples, evaluation time)
    are written only when it has them: ``take`` puts their defaults back into the slots it
    read, one slice assignment a tick, instead of the training thread storing them every
    step."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        if capacity & (capacity - 1):
            raise ValueError("the ring's capacity is a power of two")
        self.mask = capacity - 1
        # lists, not arrays: a list's item is stored by one specialised bytecode, an
        # array's through a C call that parses its argument (5× the instructions)
        self.ends: list[float] = [0.0] * capacity
        self.drawn: list[int] = [0] * capacity
        self.first_batch: list[int] = [0] * capacity
        self.examples: list[int] = [NOT_COUNTED] * capacity
        self.declared: list[int] = [0] * capacity
        self.eval_s: list[float] = [0.0] * capacity
        self.marks: deque[tuple[int, Any]] = deque(maxlen=capacity)  # (step, marks)
        self.written = 0  # the last step whose slot is complete
        self.read = 0  # the last step the agent took
        self.lost = 0

    def take(self) -> StepColumns | None:
        """Agent thread: the steps written since the last take (None: none)."""
        written, read = self.written, self.read
        if written <= read:
            return None
        capacity = self.mask + 1
        if written - read > capacity:
            self.lost += written - read - capacity
            read = written - capacity
        self.read = written
        start, stop = (read + 1) & self.mask, (written & self.mask) + 1
        runs = {name: self._run(getattr(self, name), start, stop) for name in _COLUMNS}
        for name, default in _OPTIONAL.items():
            run = runs[name]
            if run.count(default) != len(run):  # a step wrote it: its defaults back
                self._reset(getattr(self, name), start, stop, default)
        return StepColumns(read + 1, **runs)

    @staticmethod
    def _reset(column: list[Any], start: int, stop: int, default: Any) -> None:
        for first, end in _spans(start, stop, len(column)):
            column[first:end] = [default] * (end - first)

    @staticmethod
    def _run(column: list[Any], start: int, stop: int) -> list[Any]:
        head, *wrapped = _spans(start, stop, len(column))
        run = column[slice(*head)]  # one copy when the run does not wrap around
        for span in wrapped:
            run += column[slice(*span)]
        return run


_COLUMNS = StepColumns._fields[1:]
# the columns a step writes only when it has a value, with their defaults
_OPTIONAL = {"drawn": 0, "first_batch": 0, "examples": NOT_COUNTED, "eval_s": 0.0}


def _spans(start: int, stop: int, capacity: int) -> tuple[tuple[int, int], ...]:
    """The slices of slots ``start`` up to ``stop``, in order, across the lists' end."""
    if start < stop:
        return ((start, stop),)
    return ((start, capacity), (0, stop))  # it wrapped around


class Inbox:
    """The ring, and one bounded deque per other kind of record; ``append`` is the general
    one's."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.records: deque[Any] = deque(maxlen=capacity)
        self.ring = StepRing(capacity)
        self.logged: deque[dict[str, Any]] = deque(maxlen=capacity)
        self.latest: dict[str, Any] = {}  # mon.log's, while it keeps only the latest
        self.losses: deque[Any] = deque(maxlen=capacity)
        self.latest_loss: deque[Any] = deque(maxlen=1)  # the one before is freed by the job
        self.append = self.records.append


def take_all(queue: deque[Any]) -> list[Any]:
    """Agent thread: what ``queue`` holds now, in order (the training thread may append
    meanwhile: those wait for the next take)."""
    popleft = queue.popleft
    return [popleft() for _ in range(len(queue))]
