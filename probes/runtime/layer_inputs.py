"""Which dims of a layer's input may hold the examples: one rule for the noise scale's layers
and for the sample count of a model fed a one-dimensional input.

A layer's trailing input dims are its features (a linear layer's last dim, a convolution's
channels and positions); only the dims before them can be a batch. A ``[4]`` fed to
``nn.Linear(4, 16)`` therefore has no batch dim: it is one example, unbatched.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

_RMSNorm = getattr(nn, "RMSNorm", None)
# trailing input dims that are features, not positions (layer and RMS norms: their shape)
_FEATURE_DIMS = {"linear": 1, "embedding": 0}


def transposed_linear(module: nn.Module) -> bool:
    """Hugging Face's ``Conv1D`` (GPT-2's projections): a linear layer whose weight is stored
    (in, out), ``x @ W + b``. Known by its shape, so transformers need not be imported."""
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__ == "Conv1D"
        and isinstance(weight, Tensor)
        and weight.dim() == 2
        and tuple(weight.shape) == (getattr(module, "nx", None), getattr(module, "nf", None))
    )


def kind_of(module: nn.Module) -> str | None:
    if isinstance(module, nn.Linear) or transposed_linear(module):
        return "linear"
    if isinstance(module, (nn.Conv1d, nn.Conv2d)):
        return "conv"
    if isinstance(module, nn.Embedding):
        return None if module.scale_grad_by_freq else "embedding"
    if isinstance(module, nn.LayerNorm):
        return "layer_norm"
    if _RMSNorm is not None and isinstance(module, _RMSNorm):
        return "rms_norm"
    if isinstance(module, nn.GroupNorm):
        return "group_norm"
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(
        module, nn.SyncBatchNorm
    ):
        return "batch_norm"
    return None


def batch_axes(module: nn.Module, kind: str, dims: int) -> tuple[int, ...]:
    """The dims of a ``dims``-dimensional input of ``module`` (of ``kind``) that may hold the
    examples: 0, and 1 for layers applied position by position (a sequence-first input)."""
    if kind == "conv":
        return (0,) if dims == (3 if isinstance(module, nn.Conv1d) else 4) else ()
    if kind in ("group_norm", "batch_norm"):
        return (0,) if dims >= 2 else ()
    features = _FEATURE_DIMS.get(kind)
    if features is None:
        features = len(module.normalized_shape)  # type: ignore[arg-type]
    return tuple(range(max(0, min(dims - features, 2))))


def _takes_features(module: nn.Module, kind: str, width: int) -> bool:
    """Whether ``module`` takes a ``[width]`` input as one example's features."""
    if kind == "linear":
        weight = module.weight
        return int(weight.shape[0 if transposed_linear(module) else 1]) == width  # type: ignore[index]
    if kind in ("layer_norm", "rms_norm"):
        return tuple(module.normalized_shape) == (width,)  # type: ignore[arg-type]
    return False


FirstLayer = tuple[nn.Module, str] | None  # a model's first layer of a known kind, and its kind


def first_layer(model: nn.Module) -> FirstLayer:
    """The first of ``model``'s modules (in registration order) of a kind ``kind_of`` knows."""
    return next(((m, k) for m in model.modules() if (k := kind_of(m)) is not None), None)


def flat_input_examples(first: FirstLayer, x: torch.Tensor) -> tuple[int | None, str | None]:
    """The examples in a 0- or 1-dimensional model input ``x``, decided by the model's
    ``first`` layer (``first_layer``), as ``(examples, None)``, or ``(None, why)`` when that
    layer cannot say: a ``[n]`` it takes as features is one unbatched example; a ``[n]`` it
    takes with a batch dim (token ids of an embedding) is ``n`` examples."""
    shape = list(x.shape)
    if x.dim() == 0:
        return None, f"the model's input is a single number ({shape}), with no batch dimension"
    if first is None:
        return None, (
            f"the model's input {shape} has one dimension and none of its layers says "
            "whether that is a batch or one example's features"
        )
    module, kind = first
    if batch_axes(module, kind, 1) == (0,):
        return int(x.shape[0]), None
    if _takes_features(module, kind, int(x.shape[0])):
        return 1, None
    return None, (
        f"the model's input {shape} has one dimension, which its first layer "
        f"({type(module).__name__}) takes neither as a batch nor as one example's features"
    )
