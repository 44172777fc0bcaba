"""Timing marks and logged scalars, read without ever waiting for the device.

A step's time is host time: the ``perf_counter`` difference between consecutive optimizer
post-hooks (``hot_path``), which on a GPU is the pace the training loop keeps. The marks here
serve the steps the anatomy samples: on the CPU a mark is ``time.perf_counter()``; on a GPU it
is a CUDA event recorded on the current stream (asynchronous), and the agent thread only calls
``query()``, never ``synchronize()``. ``DurationResolver`` turns a run of marks into
durations (the GPU check's reference timing uses it).

Logged scalars follow the same rule: the agent thread copies a CUDA tensor to pinned host
memory with ``non_blocking=True`` on the device's current stream of the agent thread (the
default stream, which the training loop uses unless it set one of its own) and reads it once
its event has completed. A tick's values of one name are read together (``capture_run``):
on a GPU one ``torch.stack`` and one copy for all of them, not a copy and an event per step —
the agent thread's time per step is time the training thread waits for the GIL.
"""

from __future__ import annotations

import math
import numbers
from collections import deque
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, NamedTuple

import torch


@dataclass(frozen=True, slots=True)
class CudaMark:
    event: torch.cuda.Event
    host_time: float


Mark = float | CudaMark


class StepClock:
    """Makes marks (training thread) for one device: the CPU, or one CUDA device."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device if device is not None and device.type == "cuda" else None

    @classmethod
    def for_parameters(cls, params: list[torch.Tensor]) -> StepClock:
        cuda = next((p.device for p in params if p.device.type == "cuda"), None)
        return cls(cuda)

    def mark(self, now: float) -> Mark:
        if self.device is None:
            return now
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return CudaMark(event, now)


class Resolved(NamedTuple):
    """A step whose end mark is complete: its duration (None for the first) and bounds."""

    duration: float | None
    begin: Mark | None
    end: Mark


class DurationResolver:
    """Turns marks into per-step durations in order, waiting (without blocking) on CUDA."""

    def __init__(self) -> None:
        self._pending: deque[Mark] = deque()
        self._previous: Mark | None = None

    def add(self, mark: Mark) -> None:
        self._pending.append(mark)

    def resolve(self) -> list[Resolved]:
        """The steps whose end marks are complete, in order (the very first one untimed)."""
        out: list[Resolved] = []
        while self._pending:
            mark = self._pending[0]
            if isinstance(mark, CudaMark) and not mark.event.query():
                break
            self._pending.popleft()
            out.append(Resolved(elapsed(self._previous, mark), self._previous, mark))
            self._previous = mark
        return out

    @property
    def waiting(self) -> int:
        return len(self._pending)


def elapsed(previous: Mark | None, mark: Mark) -> float | None:
    """Seconds from ``previous`` to ``mark``: device time between two CUDA events, else host
    time (None without a ``previous``). Both CUDA events must have completed."""
    if previous is None:
        return None
    if isinstance(mark, CudaMark):
        if isinstance(previous, CudaMark):
            return previous.event.elapsed_time(mark.event) / 1000.0
        return mark.host_time - previous
    if isinstance(previous, CudaMark):
        return mark - previous.host_time
    return mark - previous


# --------------------------------------------------------------------------------------------
# Logged scalars
# --------------------------------------------------------------------------------------------


class ScalarError(ValueError):
    """A value given to ``mon.log`` that cannot be shown as a number."""


@dataclass(frozen=True, slots=True)
class PendingScalar:
    host: torch.Tensor
    event: torch.cuda.Event


Captured = float | torch.Tensor | PendingScalar


def capture_scalar(name: str, value: Any) -> Captured:
    """Agent thread: keep what is needed to read ``value`` later, without a device sync."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ScalarError(
                f"log({name}=...): a tensor of shape {tuple(value.shape)} is not a scalar"
            )
        value = value.detach()
        if value.device.type == "cuda":
            host = torch.empty((), dtype=value.dtype, pin_memory=True)
            host.copy_(value.reshape(()), non_blocking=True)
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(value.device))
            return PendingScalar(host, event)
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ScalarError(f"log({name}=...): {type(value).__name__} is not a number or a tensor")
    return float(value)


_IS_CUDA = attrgetter("is_cuda")


def capture_run(values: list[Any]) -> list[float] | PendingScalar | None:
    """Agent thread: a run of one name's values (one per step) kept so that one read gives
    them all: floats as they are, CPU tensors read, CUDA tensors stacked and copied off the
    device together; ``None`` when they cannot be (not all floats, or not all scalar tensors
    of one device): the caller then captures each with ``capture_scalar``, which says what is
    wrong."""
    first = values[0]
    if not isinstance(first, torch.Tensor):
        return list(values) if set(map(type, values)) == {float} else None
    try:
        if not first.is_cuda:  # tolist() keeps the GIL; item() lets go of it
            if any(map(_IS_CUDA, values)):
                return None
            read = list(map(torch.Tensor.tolist, values))
            kinds = set(map(type, read))
            if list in kinds:
                return None
            return read if kinds == {float} else list(map(float, read))
        with torch.no_grad():
            stacked = torch.stack(values)
    except (AttributeError, TypeError, ValueError, RuntimeError):  # not all tensors, or alike
        return None
    if stacked.numel() != len(values):
        return None
    host = torch.empty(len(values), dtype=stacked.dtype, pin_memory=True)
    host.copy_(stacked.reshape(-1), non_blocking=True)
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(stacked.device))
    return PendingScalar(host, event)


def read_values(captured: Captured | list[float]) -> list[float] | None:
    """Agent thread: the values a capture holds, or ``None`` while a CUDA copy is still in
    flight."""
    if isinstance(captured, PendingScalar):
        if not captured.event.query():
            return None
        captured = captured.host
    if isinstance(captured, torch.Tensor):  # an integer or bool tensor's too, as floats
        values = captured.reshape(-1).tolist()
        return values if captured.is_floating_point() else [float(v) for v in values]
    return captured if isinstance(captured, list) else [captured]


def finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
