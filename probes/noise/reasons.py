"""Why the noise scale is off or measured another way, in words for whoever reads them: the
author of a script that calls ``attach()``, or someone running it under ``bsmon run``
(``runtime.audience``)."""

from __future__ import annotations

from torch import nn

from ..runtime.audience import say
from .layers import SUPPORTED_NAMES


def not_ddp(world: int, model: nn.Module | None) -> str:
    """A rank of a distributed run whose model is not DistributedDataParallel and holds none:
    bsmon cannot tell whether (or how) its gradients are averaged with the other ranks', so
    it cannot tell the local batch from the global one."""
    name = type(model).__name__ if model is not None else "no model"
    why = (
        f"distributed run ({world} ranks), and this rank's model ({name}) is not "
        "DistributedDataParallel and holds none: its gradients are averaged some other way "
        "(FSDP, DeepSpeed, a hand-written all-reduce) or not at all (each rank training on "
        "its own), so bsmon cannot tell this rank's batch from the global one"
    )
    return say(
        attach=f"{why}; if DDP wraps the model, pass the wrapped model to attach()",
        run=f"{why}; the noise scale is off",
    )


def sharded_only_per_example(mode: str) -> str:
    """FSDP2 shards the gradients: only the per-example estimate sums them across ranks."""
    return (
        f"noise_scale={mode!r} is not supported under sharding (FSDP2): it would read sharded "
        "gradients on the training thread; 'auto' or 'per_example' measure it"
    )


def fsdp1() -> str:
    """FSDP1 flattens the parameters: no layer's gradient is its own."""
    why = (
        "FSDP1 (FullyShardedDataParallel) flattens each wrapped unit's parameters into one "
        "sharded FlatParameter, so no gradient can be told apart by layer; the noise scale "
        "is measured under FSDP2 (fully_shard)"
    )
    return say(attach=why, run=f"{why}; it is off")


def partitions_hold_all(coverage: float) -> str:
    """DeepSpeed's flat partitions hold every parameter's gradient, the layers bsmon
    measures per example only some."""
    return (
        f"per-example norms cover {coverage:.0%} of the trainable parameters, and DeepSpeed's "
        "flat gradient partitions hold all of them: their |ḡ|² would not match"
    )


def comm_hook_taken() -> str:
    """DDP allows one communication hook, and the job registered its own first."""
    return say(
        attach="the DDP model had a comm hook before attach() (attach first, so bsmon can wrap it)",
        run="the script registered a DDP comm hook before bsmon attached (at the first "
        "optimizer step), and DDP allows only one",
    )


def needs_accumulation(unfit: str) -> str:
    """auto fell back to micro-batch norms, per-example norms not fitting the job (``unfit``),
    and the job takes one backward pass a step: waiting brings no estimate."""
    why = (
        f"{unfit}; micro-batch norms need gradient accumulation, and this job takes one "
        "backward pass a step, so waiting will not bring an estimate"
    )
    return say(
        attach=f"{why}: gradient accumulation (attach(..., micro_batch_size=N)) or DDP would "
        "make it measurable",
        run=f"{why}: a script that accumulates gradients (or runs DDP) would make it measurable",
    )


def no_layers() -> str:
    """No layer of the model has per-example norms bsmon can compute."""
    return f"no layer bsmon can measure per example ({SUPPORTED_NAMES}); " + say(
        attach="use noise_scale='microbatch' with gradient accumulation, or 'sequential' (biased)",
        run="micro-batch norms need the script to accumulate gradients",
    )
