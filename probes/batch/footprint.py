"""What a rank holds whatever its batch: parameters, gradients and optimizer state (under
FSDP2 its shards of them, ``p.to_local()``), and the parameters FSDP2 gathers whole.

Read on the agent thread from tensor sizes only (``to_local`` is this rank's shard, with no
communication). Under FSDP2 each ``fully_shard`` module's parameters are one group, gathered
whole before the module runs: the largest group is the all-gather's peak, and each group is
gathered again by every micro-batch of an accumulated step (forward, unless the group is
left unsharded after backward; backward, when it was resharded after forward).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torch import Tensor, nn

from ..units import bytes_ as nbytes_text


@dataclass(frozen=True)
class Footprint:
    """Bytes per rank: ``parameters``, ``gradients`` (of those that train) and ``optimizer``
    state as this rank holds them; ``gathered``: the largest group FSDP2 unshards at once
    (0: not sharded); ``per_micro_batch``: the bytes gathered again by each micro-batch
    of an accumulated step after its first;
    ``shards``: the ranks a parameter is divided over (1: not sharded)."""

    parameters: int
    gradients: int
    optimizer: int
    gathered: int = 0
    per_micro_batch: int = 0
    shards: int = 1

    @property
    def held(self) -> int:
        """Held from the second step on, at every moment of a step (gradients may be freed
        by ``zero_grad``; a gathered group is freed once its module has run)."""
        return self.parameters + self.optimizer

    @property
    def fixed(self) -> int:
        """The part of a step's memory that no batch size changes."""
        return self.parameters + self.gradients + self.optimizer + self.gathered

    def describe(self) -> str:
        whose = f"this rank's shards, 1/{self.shards} each" if self.shards > 1 else "unsharded"
        text = (
            f"parameters {nbytes_text(self.parameters)}, gradients "
            f"{nbytes_text(self.gradients)}, optimizer state {nbytes_text(self.optimizer)} "
            f"({whose})"
        )
        if self.gathered:
            text += f", and the largest group gathered whole, {nbytes_text(self.gathered)}"
        return text


def footprint_of(model: nn.Module | None, optimizer: object) -> Footprint:
    """The rank's footprint now (the optimizer's state exists after its first step)."""
    params = [p for group in getattr(optimizer, "param_groups", ()) for p in group["params"]]
    if model is not None:  # and the parameters it does not train
        seen, sharded = {id(p) for p in params}, sharded_parameters(params)
        # while a group runs FSDP2 puts its whole parameters on the modules: only shards count
        params += [
            p
            for p in model.parameters()
            if id(p) not in seen and (not sharded or sharded_parameters([p]))
        ]
    groups = fsdp_groups(model)
    return Footprint(
        parameters=sum(_local_bytes(p) for p in params),
        gradients=sum(_local_bytes(p) for p in params if p.requires_grad),
        optimizer=_state_bytes(getattr(optimizer, "state", {})),
        gathered=max((whole for whole, _times in groups), default=0),
        per_micro_batch=sum(whole * times for whole, times in groups),
        shards=max((_shards(p) for p in params), default=1),
    )


def sharded_parameters(params: Iterable[Tensor]) -> bool:
    """Whether any parameter is a DTensor (FSDP2's ``fully_shard``, tensor parallelism)."""
    return any(hasattr(p, "to_local") and hasattr(p, "device_mesh") for p in params)


def fsdp_groups(model: nn.Module | None) -> list[tuple[int, int]]:
    """Each ``fully_shard`` module's own parameters: (bytes gathered whole, the gathers
    each micro-batch after a step's first adds). Empty: no FSDP2 module."""
    if model is None:
        return []
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return []
    groups = []
    for module in model.modules():
        if isinstance(module, FSDPModule):
            own = _own_parameters(module, FSDPModule)
            whole = sum(p.numel() * p.element_size() for p in own)  # a DTensor's: global
            groups.append((whole, _gathers_per_micro_batch(module)))
    return groups


def _own_parameters(module: nn.Module, fsdp: type) -> list[Tensor]:
    """The parameters ``module`` gathers: its own, not those of an FSDP module inside it."""
    inner = {
        id(p)
        for child in module.modules()
        if child is not module and isinstance(child, fsdp)
        for p in child.parameters()
    }
    return [p for p in module.parameters() if id(p) not in inner]


def _gathers_per_micro_batch(module: nn.Module) -> int:
    """FSDP2's own settings (its defaults where they cannot be read): forward gathers again
    when backward resharded, backward when forward did (the root never reshards after
    forward: its state says so once it has run)."""
    try:
        groups = list(module._get_fsdp_state()._fsdp_param_groups)  # type: ignore[operator]
    except (AttributeError, TypeError):
        return 2
    if not groups:
        return 0
    group = groups[0]
    after_backward = bool(getattr(group, "reshard_after_backward", True))
    after_forward = getattr(group, "post_forward_mesh_info", True) is not None
    return int(after_backward) + int(after_forward)


def _local_bytes(t: Tensor) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def _state_bytes(state: object) -> int:
    """The tensors in an optimizer's state (``list`` first: the training thread may add a
    parameter's state while this reads)."""
    values: Iterable[object] = list(state.values()) if isinstance(state, dict) else []
    total = 0
    for entry in values:
        for value in list(entry.values()) if isinstance(entry, dict) else ():
            if isinstance(value, Tensor):
                total += _local_bytes(value)
    return total


def _shards(t: Tensor) -> int:
    """The ranks ``t`` is divided over (its mesh's sharded dimensions)."""
    placements, mesh = getattr(t, "placements", None), getattr(t, "device_mesh", None)
    if placements is None or mesh is None:
        return 1
    count = 1
    for dim, placement in enumerate(placements):
        if placement.is_shard():
            count *= mesh.size(dim)
    return count
