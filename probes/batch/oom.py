"""Recognising out-of-memory errors, from CUDA, ROCm, MPS or the CPU allocator (light: the
probe's sidecar imports it; the recovery is ``oom_recovery``)."""

from __future__ import annotations

import gc

import torch

_OOM_MESSAGES = (
    "out of memory",  # CUDA, HIP, MPS, XPU ("... out of memory. Tried to allocate ...")
    "CUDNN_STATUS_NOT_SUPPORTED",  # cuDNN sometimes reports an OOM this way
    "CUBLAS_STATUS_ALLOC_FAILED",
    "can't allocate memory",  # DefaultCPUAllocator
)


def is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in _OOM_MESSAGES)


def release_memory() -> None:
    """Give back what an aborted step held: Python garbage, then the CUDA cache."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
