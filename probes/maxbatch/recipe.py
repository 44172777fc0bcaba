"""The probe recipe: what the sidecar needs to rebuild one training step of the job.

Built in the job on the probe's own thread without touching the job's state: the model is
pickled with cloudpickle (so classes defined in ``__main__`` travel by value), but every
tensor in it is replaced by a spec (shape, dtype, requires_grad); the sidecar makes fresh
tensors of those shapes. No weight is copied, no device is synchronised, no RNG is drawn.
The optimizer travels as its class and constructor arguments (filtered to what the
constructor accepts), the loss as ``loss_fn`` or ``probe_step(model, batch)``, and one real
batch the job already used (the largest seen) as ordinary CPU tensors.

The recipe file is private (0600) and removed after the probe.
"""

from __future__ import annotations

import inspect
import io
import os
import pickle
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cloudpickle
import torch

RECIPE_VERSION = 1
_CPU = torch.device("cpu")
_target_device: ContextVar[torch.device | None] = ContextVar("bsmon_probe_device", default=None)


class RecipeError(ValueError):
    """The job cannot be probed as it stands; the message says what to change."""


@dataclass
class Recipe:
    model: bytes
    optimizer_class: type
    optimizer_kwargs: dict[str, Any]
    param_groups: list[dict[str, Any]]
    batch: Any
    batch_size: int
    device: str
    job_batch_size: int
    loss_fn: Any = None
    probe_step: Any = None
    autocast_dtype: str | None = None
    cudnn_benchmark: bool = False
    memory_budget: int | None = None
    max_batch_size: int | None = None
    job_points: list[tuple[int, int]] = field(default_factory=list)
    job_budget: int | None = None
    step_time_cap_s: float = 20.0
    threads: int = 0
    sizes: list[int] | None = None  # measure exactly these (benchmarks) instead of planning
    version: int = RECIPE_VERSION


# -- tensors as specs ----------------------------------------------------------------------


def _fresh_tensor(
    shape: tuple[int, ...], dtype: torch.dtype, requires_grad: bool, parameter: bool
) -> torch.Tensor:
    """A new tensor of the job's shape on the sidecar's device (values do not matter for
    memory or speed; small random floats keep every op finite)."""
    tensor = torch.empty(shape, dtype=dtype, device=_target_device.get() or _CPU)
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.normal_(0.0, 0.02)
    else:
        tensor.zero_()
    if parameter:
        return torch.nn.Parameter(tensor, requires_grad=requires_grad)
    return tensor.requires_grad_(requires_grad) if tensor.is_floating_point() else tensor


def _is_bsmon_hook(hook: Any) -> bool:
    owner = getattr(hook, "__self__", None)
    module = type(owner).__module__ if owner is not None else getattr(hook, "__module__", "")
    return (module or "").startswith("bsmon.")


def _new_module(cls: type) -> torch.nn.Module:
    return cls.__new__(cls)


def _module_state(module: torch.nn.Module) -> dict[str, Any]:
    """The module's state without bsmon's own hooks (the user's hooks travel)."""
    state = dict(module.__dict__)
    for key, value in state.items():
        if key.endswith("hooks") and isinstance(value, dict):
            state[key] = type(value)((k, h) for k, h in value.items() if not _is_bsmon_hook(h))
    return state


class _SpecPickler(cloudpickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.nn.Module):
            return _new_module, (type(obj),), _module_state(obj)
        if isinstance(obj, torch.Tensor):
            if (
                obj.layout != torch.strided
                or obj.is_quantized
                or type(obj) not in (torch.Tensor, torch.nn.Parameter)
            ):
                raise RecipeError(
                    f"the probe cannot rebuild a {type(obj).__name__} "
                    f"({obj.layout}) tensor in the model"
                )
            parameter = isinstance(obj, torch.nn.Parameter)
            return _fresh_tensor, (tuple(obj.shape), obj.dtype, obj.requires_grad, parameter)
        return super().reducer_override(obj)


def pickle_structure(model: torch.nn.Module) -> bytes:
    """The model with every tensor as a spec. Classes from ``__main__`` travel by value;
    others by reference (the sidecar runs with the job's ``sys.path`` and working directory)."""
    buffer = io.BytesIO()
    _SpecPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(model)
    return buffer.getvalue()


def load_structure(data: bytes, device: torch.device) -> torch.nn.Module:
    token = _target_device.set(device)
    try:
        return pickle.loads(data)
    finally:
        _target_device.reset(token)


# -- the optimizer -------------------------------------------------------------------------


def optimizer_spec(
    optimizer: torch.optim.Optimizer, model: torch.nn.Module
) -> tuple[type, dict[str, Any], list[dict[str, Any]]]:
    """The optimizer's class, constructor keywords, and its param groups as indices into
    ``model.parameters()`` with each group's own settings."""
    cls = type(optimizer)
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self", "params"}
    kwargs = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    index = {id(p): i for i, p in enumerate(model.parameters())}
    groups = []
    for group in optimizer.param_groups:
        try:
            indices = [index[id(p)] for p in group["params"]]
        except KeyError:
            raise RecipeError(
                "the optimizer holds parameters that are not in the model; "
                "attach the module that owns them"
            ) from None
        settings = {k: v for k, v in group.items() if k in accepted}
        groups.append({"indices": indices, **_plain(settings)})
    return cls, _plain(kwargs), groups


def _plain(settings: dict[str, Any]) -> dict[str, Any]:
    """Tensor-valued settings (a tensor lr) as plain numbers."""
    return {
        k: (v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v)
        for k, v in settings.items()
    }


def build_optimizer(recipe: Recipe, model: torch.nn.Module) -> torch.optim.Optimizer:
    params = list(model.parameters())
    groups = [
        {
            "params": [params[i] for i in g["indices"]],
            **{k: v for k, v in g.items() if k != "indices"},
        }
        for g in recipe.param_groups
    ]
    return recipe.optimizer_class(groups, **recipe.optimizer_kwargs)


# -- the batch -----------------------------------------------------------------------------


def batch_numel(batch: Any) -> int:
    if isinstance(batch, torch.Tensor):
        return batch.numel()
    if isinstance(batch, dict):
        return sum(batch_numel(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(batch_numel(v) for v in batch)
    return 0


def to_cpu(batch: Any) -> Any:
    return _map_tensors(batch, lambda t: t.detach().to("cpu", copy=True))


def tile(batch: Any, own_size: int, size: int) -> Any:
    """The batch grown (or cut) to ``size`` along dim 0, repeating its samples."""
    index = torch.arange(size) % own_size
    return _map_tensors(
        batch, lambda t: t[index.to(t.device)] if t.dim() and t.shape[0] == own_size else t
    )


def move(batch: Any, device: torch.device) -> Any:
    return _map_tensors(batch, lambda t: t.to(device))


def _map_tensors(batch: Any, fn: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, dict):
        return type(batch)({k: _map_tensors(v, fn) for k, v in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_map_tensors(v, fn) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_map_tensors(v, fn) for v in batch)
    return batch


def compute_loss(recipe: Recipe, model: torch.nn.Module, batch: Any) -> torch.Tensor:
    """One forward pass and loss, by the job's probe_step, loss_fn, or a dict batch's loss."""
    if recipe.probe_step is not None:
        return recipe.probe_step(model, batch)
    if isinstance(batch, dict):
        out = model(**batch)
        loss = getattr(out, "loss", None)
        if loss is None and isinstance(out, dict):
            loss = out.get("loss")
        if loss is None:
            raise RecipeError(
                "the model's output has no loss; pass "
                "attach(..., probe_step=fn(model, batch) -> loss)"
            )
        return loss
    if recipe.loss_fn is not None and isinstance(batch, (list, tuple)) and len(batch) >= 2:
        return recipe.loss_fn(model(batch[0]), batch[1])
    raise RecipeError(
        "the probe needs attach(..., loss_fn=...) for (input, target) batches, or "
        "attach(..., probe_step=fn(model, batch) -> loss)"
    )


# -- the file ------------------------------------------------------------------------------


def write(recipe: Recipe, directory: Path) -> Path:
    """Write the recipe to a private file (0600) in ``directory``; the caller removes it."""
    fd, name = _private_file(directory)
    with os.fdopen(fd, "wb") as f:
        cloudpickle.dump(recipe, f, protocol=pickle.HIGHEST_PROTOCOL)
    return Path(name)


def _private_file(directory: Path) -> tuple[int, str]:
    import tempfile

    return tempfile.mkstemp(prefix="probe-", suffix=".recipe", dir=directory)


def read(path: Path) -> Recipe:
    with open(path, "rb") as f:
        recipe = pickle.load(f)
    if not isinstance(recipe, Recipe) or recipe.version != RECIPE_VERSION:
        raise RecipeError(f"{path} is not a bsmon probe recipe of version {RECIPE_VERSION}")
    return recipe
