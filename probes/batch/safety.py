"""Which batch sizes are risky enough to ask first, and why (besides the OOM history and the
probe, which the controller checks itself).

- **Beyond what has been measured to fit.** A size larger than every size the job has run
  is checked against a memory model: the device's fitted line when two sizes have run
  (``MemoryModel.needs_confirmation``), else a proportional bound, peak(b)·B/b from a measured
  size b < B, which cannot underestimate while the memory that does not grow with the batch
  is ≥ 0; what every step holds whatever the batch (the parameters and optimizer state, under
  FSDP2 this rank's shards: ``footprint``) is left out of the scaling. On the CPU the bound
  uses the job's resident memory against what the host has available. With no reading at
  all, a larger size is unmeasured and asks.
- **More than 2× from the last size that trained well** (ran ``loss_watch.WATCH_STEPS`` steps
  after its change without the loss diverging), up or down: the learning-rate rule is a
  first-order correction, and large jumps are where it fails.
"""

from __future__ import annotations

from ..units import bytes_
from .memory_model import SAFE_FRACTION, MemoryModel

RATIO = 2.0
GIB = 2**30


def ratio_reason(value: int, trained_well: int) -> str | None:
    """Why ``value`` is too far from ``trained_well``, or None."""
    ratio = max(value / trained_well, trained_well / value)
    if ratio <= RATIO:
        return None
    times = f"{ratio:.3g}× the" if value > trained_well else f"1/{ratio:.3g} of the"
    return (
        f"{value} is {times} last batch size that trained well ({trained_well}); more than "
        f"{RATIO:g}× in one go can upset training even with the learning rate rescaled"
    )


def memory_reason(
    value: int,
    current: int,
    *,
    device: MemoryModel,
    device_budget: int | None,
    host: MemoryModel,
    host_budget: int | None,
) -> str | None:
    """Why ``value`` is not measured to fit in memory, or None."""
    model, budget, where = (
        (device, device_budget, "device")
        if device.points()
        else (host, host_budget, "host (no device memory to model on the CPU)")
    )
    measured = [p.batch_size for p in model.points()]
    if value <= max(measured, default=current):
        return None  # this size or a larger one has run
    if not measured:
        return (
            f"{value} is unmeasured: no memory reading at any batch size yet, so nothing "
            f"says it fits (the largest size run is {current})"
        )
    if model is device and (why := device.needs_confirmation(value, budget)) is not None:
        return why
    if model is device and device.fit() is not None:
        return None  # the fitted line predicts it fits
    bound = model.proportional_bound(value)
    if bound is None or not budget:
        return (
            f"{value} is above every measured size ({max(measured)}) and the {where} "
            "budget is unknown"
        )
    if bound <= SAFE_FRACTION * budget:
        return None
    held = model.footprint.held if model.footprint is not None else 0
    above = f" above the {bytes_(held)} every step holds" if held else ""
    return (
        f"{value} is above every measured size ({max(measured)}); scaled from it{above}, "
        f"memory could reach {bound / GIB:.1f} GiB, {bound / budget:.0%} of the "
        f"{budget / GIB:.1f} GiB {where} available"
    )
