"""DeepSpeed's engine as bsmon meets it: the model the script calls.

``deepspeed.initialize`` wraps the model in a ``DeepSpeedEngine`` (an ``nn.Module``: the
script calls it) and, under ZeRO stage 1 or 2, the script's torch optimizer in a ZeRO
optimizer that hands the torch one flat fp32 partitions of the parameters instead of the
parameters themselves. bsmon attaches to the torch optimizer it sees stepped, so:

- no module holds that optimizer's tensors: the model is found through the engine that owns
  the optimizer (``find_engine``);
- the noise scale reads the averaged gradient where the engine keeps it (``noise/zero.py``).

Nothing here imports deepspeed: an engine exists only where the script imported it.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn


def engine_class() -> type | None:
    """DeepSpeed's engine class, if the job imported deepspeed."""
    module = sys.modules.get("deepspeed")
    return getattr(module, "DeepSpeedEngine", None) if module is not None else None


def is_engine(model: object) -> bool:
    cls = engine_class()
    return cls is not None and isinstance(model, cls)


def _optimizers_of(engine: Any) -> list[Any]:
    """The engine's optimizer, what it wraps, and the optimizer it was given."""
    outer = getattr(engine, "optimizer", None)
    return [outer, getattr(outer, "optimizer", None), getattr(engine, "basic_optimizer", None)]


def find_engine(optimizer: torch.optim.Optimizer, objects: list[Any]) -> nn.Module | None:
    """The engine among ``objects`` (the heap) that steps ``optimizer``, if any."""
    cls = engine_class()
    if cls is None:
        return None
    for obj in objects:
        if issubclass(type(obj), cls) and any(o is optimizer for o in _optimizers_of(obj)):
            return obj
    return None
