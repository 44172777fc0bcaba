"""One optimizer step's measurement, handed from the training thread to the agent thread.

The training thread never reads a number off the device: it stacks the step's few scalar
tensors into one small tensor and hands that over — a CPU tensor by reference (its kernels
have already run), a CUDA tensor as a ``non_blocking`` copy into pinned host memory with an
event that the agent thread polls (the same rule as ``timing.capture_scalar``).

Layout of ``values``: ``[Y, scale, u_1, …, u_k]`` and, when ``unaccounted`` is set, one last
value that must be zero. ``Y`` is the squared norm of the step's gradient, ``scale`` the loss
scale in force (1 without a grad scaler), ``u_j`` the summed squared norms of the j-th group
of units described by ``units[j] = (count, size, factor)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..runtime.timing import PendingScalar

Captured = torch.Tensor | PendingScalar


@dataclass(frozen=True, slots=True)
class StepRecord:
    step: int
    estimator: str
    values: Captured
    examples: float
    units: tuple[tuple[int, float, float], ...]
    unaccounted: tuple[int, ...] = ()  # ids of parameters whose gradient must be zero
    problem: str | None = None  # the training thread already knows the step is unusable
    gap: int = 1  # training steps since the previous measured step


def capture(values: list[torch.Tensor]) -> Captured:
    """Stack 0-dim tensors (float32 sums of squares, which bsmon accumulates in float32)
    into one small tensor without synchronising the device."""
    device = values[0].device
    if all(v.dim() == 0 and v.dtype == torch.float32 and v.device == device for v in values):
        packed = torch.stack(values).detach()  # the usual case: no conversion to make
    else:
        packed = torch.stack([v.detach().reshape(()).to(device, torch.float32) for v in values])
    if device.type != "cuda":
        return packed
    host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
    host.copy_(packed, non_blocking=True)
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return PendingScalar(host, event)


def read(captured: Captured) -> list[float] | None:
    """Agent thread: the values, or None while a device copy is still in flight."""
    if isinstance(captured, PendingScalar):
        if not captured.event.query():
            return None
        return captured.host.tolist()
    return captured.tolist()
