"""How long one micro-batch's re-gather takes in a sharded job (FSDP2) that grows its batch by
gradient accumulation: measured where the step anatomy times FSDP2's collectives (the wait
they add to a step, ``comm_s``, over its micro-batches: each gathers and reduce-scatters
alike), else estimated from the bytes gathered per micro-batch (``Footprint.per_micro_batch``)
at an assumed bandwidth, which the reason states.

An all-gather over n ranks moves (n-1)/n of the gathered bytes into each rank.
"""

from __future__ import annotations

from collections.abc import Callable

from ..units import bytes_, duration
from ..wire.protocol import StepAnatomy
from .footprint import Footprint
from .goodput import Regather

# bytes per second an all-gather brings into each rank, assumed when none is measured:
# NCCL reaches 100+ GB/s within a node, a few tens across nodes; gloo between 2 ranks on one
# busy host here, 0.4 GB/s (1-16 MiB gathered)
ASSUMED_BANDWIDTH = {"cuda": 25e9, "cpu": 0.5e9}


class RegatherCost:
    """The re-gather's price per micro-batch for the advisor's step-time model."""

    def __init__(
        self,
        footprint: Callable[[], Footprint | None],
        *,
        micro_batch: Callable[[], int | None],
        world_size: int,
        device_type: str,
        anatomy: Callable[[], StepAnatomy | None] = lambda: None,
    ) -> None:
        self._footprint = footprint
        self._micro_batch = micro_batch
        self._world = world_size
        self._bandwidth = ASSUMED_BANDWIDTH.get(device_type, ASSUMED_BANDWIDTH["cuda"])
        self._device_type = device_type
        self._anatomy = anatomy

    def at(self, size: int) -> Regather | None:
        """The price, counted from ``size`` (the current batch); None where growing adds no
        re-gather: no accumulation, nothing sharded, or the job keeps its parameters whole."""
        micro, footprint = self._micro_batch(), self._footprint()
        if not micro or footprint is None or footprint.shards < 2:
            return None
        if footprint.per_micro_batch <= 0:
            return None
        base = max(1, size // micro)
        wait = getattr(self._anatomy(), "comm_s", None)  # a sampled step's, when measured
        if wait:
            return Regather(
                micro,
                base,
                wait / base,
                f"measured: FSDP2's collective wait in the step anatomy, {duration(wait)} a "
                f"step of {base} micro-batch{'es' if base != 1 else ''}",
            )
        moved = footprint.per_micro_batch * (self._world - 1) / self._world
        return Regather(
            micro,
            base,
            moved / self._bandwidth,
            f"estimated: {bytes_(footprint.per_micro_batch)} gathered per micro-batch at an "
            f"assumed {self._bandwidth / 1e9:g} GB/s on {self._device_type} (no all-gather "
            "time measured)",
        )
