"""Per-example squared gradient norms of one layer, from its input and its output gradient.

Each function returns a ``(B,)`` tensor: for every example ``i`` of the batch (dim 0), the
squared norm of that example's *contribution* to the layer's parameter gradients (weight and
bias together), i.e. ``|c_i|²`` where ``p.grad = Σ_i c_i``. Nothing here touches hooks or the
agent; these are pure tensor functions, checked against brute force in the tests.

``w2`` is an optional per-parameter weight of the same shape as the parameter (the squared
Adam preconditioner ``1/(√v̂+ε)²``); with it the result is ``Σ w2 ⊙ c_i²``.

Methods (research note §5): the Goodfellow trick for 2-D linear inputs; for sequences and
convolutions either the "ghost" Gram form (no per-example gradient is formed) or per-example
gradients materialised in chunks, whichever needs fewer FLOPs; sorted segment sums for
embeddings; closed forms for the affine parameters of normalisation layers.

Why one module: every function here is the same kind of thing — a layer type's closed form,
checked against brute force in one test file — and they share the chunking, the working
dtype and the preconditioner's weights; split by layer type, each piece would import the
others' helpers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# Per-example gradients are materialised in chunks of at most this many elements (float32:
# 64 MiB), so the transient memory stays bounded whatever the batch.
CHUNK_ELEMENTS = 1 << 24

Weights = tuple[Tensor | None, Tensor | None]  # (weight w2, bias w2)


def _work_dtype(t: Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _as_work(t: Tensor) -> Tensor:
    t = t.detach()
    dtype = _work_dtype(t)
    return t if t.dtype == dtype else t.to(dtype)


def _sq(t: Tensor, dims: tuple[int, ...], w2: Tensor | None = None) -> Tensor:
    """Σ over ``dims`` of t² (weighted by w2, broadcast from the right). Unweighted, it is a
    norm reduction: no temporary of t's size (which on the CPU costs more than the sum)."""
    if w2 is None:
        return torch.linalg.vector_norm(t, dim=dims, dtype=_work_dtype(t)).square()
    t2 = _as_work(t).square() * w2.to(_work_dtype(t))
    return t2.sum(dims)


def _flat_batch(x: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """(B, *, d) → (B, T, d), with T the product of the middle dims."""
    b = x.shape[0]
    return x.reshape(b, -1, x.shape[-1]), g.reshape(b, -1, g.shape[-1])


def matmul_grad_sq(
    a: Tensor, g: Tensor, w2: Tensor | None = None, groups: int = 1, bias: bool = False
) -> Tensor:
    """Per-example ``|Σ_t g_t a_tᵀ|²`` for a: (B, T, din), g: (B, T, dout).

    With ``groups > 1`` the feature dims are split into that many independent blocks (grouped
    convolutions): ``din = groups·din_g``, ``dout = groups·dout_g``. With ``bias`` the
    unweighted ``|Σ_t g_t|²`` of a bias is added: in the ghost form one op, for a bias is a
    weight whose input is 1 at every position (``a_t·a_s + 1``)."""
    b, t, din = a.shape
    dout = g.shape[2]
    din_g, dout_g = din // groups, dout // groups
    ghost_cost = t * t * (din_g + dout_g)
    materialise_cost = t * din_g * dout_g
    if w2 is None and ghost_cost <= materialise_cost:
        if groups == 1:
            gram_a = torch.bmm(a, a.transpose(1, 2))
            if bias:
                gram_a.add_(1)
            gram_g = torch.bmm(g, g.transpose(1, 2))
            return (gram_a * gram_g).sum((1, 2))
        ag = a.reshape(b, t, groups, din_g).permute(0, 2, 1, 3)  # (B, G, T, din_g)
        gg = g.reshape(b, t, groups, dout_g).permute(0, 2, 1, 3)
        gram_a = torch.matmul(ag, ag.transpose(2, 3))
        gram_g = torch.matmul(gg, gg.transpose(2, 3))
        total = (gram_a * gram_g).sum((1, 2, 3))
        return total + _sq(g.sum(1), (1,)) if bias else total
    # materialise per-example gradients (B, G, dout_g, din_g), a chunk of examples at a time
    per_example = groups * dout_g * din_g
    step = max(1, CHUNK_ELEMENTS // max(per_example, 1))
    if w2 is not None:
        w2 = w2.reshape(groups, dout_g, din_g).to(a.dtype)
    out = []
    for start in range(0, b, step):
        ac = a[start : start + step].reshape(-1, t, groups, din_g).permute(0, 2, 3, 1)
        gc = g[start : start + step].reshape(-1, t, groups, dout_g).permute(0, 2, 1, 3)
        grads = torch.matmul(ac, gc)  # (b', G, din_g, dout_g)
        out.append(_sq(grads.transpose(2, 3), (1, 2, 3), w2))
    total = torch.cat(out) if len(out) > 1 else out[0]
    return total + _sq(g.sum(1), (1,)) if bias else total


# --------------------------------------------------------------------------------------------
# Layers
# --------------------------------------------------------------------------------------------


def linear_input_sq(x: Tensor) -> Tensor:
    """For a 2-D input: per-example |a_i|², taken in the forward so the input can be freed."""
    return _sq(x.detach(), (1,))


def linear_input_term(x: Tensor, bias: bool) -> Tensor:
    """For a 2-D input, what ``linear`` multiplies |g_i|² by: |a_i|² (+ 1 for a bias)."""
    a_sq = linear_input_sq(x)
    return a_sq.add_(1) if bias else a_sq


def linear(
    x: Tensor | None,
    g: Tensor,
    *,
    weight: bool,
    bias: bool,
    w2: Weights = (None, None),
    x_term: Tensor | None = None,
) -> Tensor:
    """nn.Linear: x (B, *, din), g (B, *, dout). For a 2-D input without a preconditioner,
    ``x_term`` may stand for the input: ``linear_input_term(x, bias)``, taken in the forward
    (then ``x`` may be None, and only |g_i|² is left to compute)."""
    g = g.detach()
    w2w, w2b = w2
    if x_term is not None:  # Goodfellow: |g_i a_iᵀ|² = |g_i|²|a_i|², and the bias adds |g_i|²
        g_sq = _sq(g, (1,))
        return g_sq.mul_(x_term) if weight else g_sq
    if g.dim() == 2:
        if weight and w2w is not None:
            assert x is not None
            g2 = _as_work(g).square()
            total = (torch.matmul(g2, w2w.to(g2.dtype)) * _as_work(x).square()).sum(1)
            return total + _sq(g, (1,), w2b) if bias else total
        g_sq = None if (bias and w2b is not None) else _sq(g, (1,))
        if not weight:
            return g_sq if g_sq is not None else _sq(g, (1,), w2b)
        a_sq = linear_input_sq(x)  # type: ignore[arg-type]
        if g_sq is None:  # weight unweighted, bias weighted
            return _sq(g, (1,)) * a_sq + _sq(g, (1,), w2b)
        return g_sq * (a_sq + 1) if bias else g_sq * a_sq
    assert x is not None
    a3, g3 = _flat_batch(_as_work(x), _as_work(g))
    if weight and w2b is None:
        return matmul_grad_sq(a3, g3, w2w, bias=bias)
    total = matmul_grad_sq(a3, g3, w2w) if weight else g3.new_zeros(g3.shape[0])
    if bias:
        total = total + _sq(g3.sum(1), (1,), w2b)
    return total


def _conv_patches(module: nn.Conv1d | nn.Conv2d, x: Tensor) -> Tensor:
    """The input patches a convolution multiplies with its weight: (B, Cin·K, L)."""
    mode = "constant" if module.padding_mode == "zeros" else module.padding_mode
    pad = list(module._reversed_padding_repeated_twice)
    if any(pad):
        x = F.pad(x, pad, mode=mode)
    if isinstance(module, nn.Conv1d):
        return F.unfold(
            x.unsqueeze(2),
            kernel_size=(1, module.kernel_size[0]),
            dilation=(1, module.dilation[0]),
            stride=(1, module.stride[0]),
        )
    return F.unfold(x, module.kernel_size, dilation=module.dilation, stride=module.stride)


CONV_METHODS = ("patches", "grouped")


def conv(
    module: nn.Conv1d | nn.Conv2d,
    x: Tensor,
    g: Tensor,
    *,
    weight: bool,
    bias: bool,
    w2: Weights = (None, None),
    method: str = "patches",
) -> Tensor:
    """nn.Conv1d / nn.Conv2d with a batched input x (B, Cin, *) and g (B, Cout, *).

    Two exact methods whose speed depends on the layer and the device: ``patches`` unfolds
    the input (im2col) and takes the ghost or the materialised form; ``grouped`` runs the
    convolution's own weight-gradient kernel once with the batch as groups, which yields
    every example's weight gradient at once."""
    g = _as_work(g)
    b = g.shape[0]
    g3 = g.reshape(b, g.shape[1], -1)  # (B, Cout, L)
    total = g3.new_zeros(b)
    if weight and method == "grouped":
        grads = _grouped_weight_grads(module, _as_work(x), g)
        w2w = None if w2[0] is None else w2[0].reshape(grads.shape[1:])
        total = _sq(grads, (1, 2, 3), w2w)
    elif weight:
        patches = _conv_patches(module, _as_work(x))  # (B, Cin·K, L)
        total = matmul_grad_sq(
            patches.transpose(1, 2), g3.transpose(1, 2), w2[0], groups=module.groups
        )
    if bias:
        total = total + _sq(g3.sum(2), (1,), w2[1])
    return total


def _grouped_weight_grads(module: nn.Conv1d | nn.Conv2d, x: Tensor, g: Tensor) -> Tensor:
    """Per-example weight gradients (B, Cout, Cin/groups, K): one weight-gradient kernel
    call on the batch folded into the channels, with B·groups groups."""
    b = x.shape[0]
    padding: object = module.padding
    if isinstance(padding, str) or (module.padding_mode != "zeros" and any(module.padding)):
        mode = "constant" if module.padding_mode == "zeros" else module.padding_mode
        x = F.pad(x, list(module._reversed_padding_repeated_twice), mode=mode)
        padding = (0,) * (x.dim() - 2)
    weight = module.weight
    shape = (b * weight.shape[0], *weight.shape[1:])
    _, grads, _ = torch.ops.aten.convolution_backward(
        g.reshape(1, -1, *g.shape[2:]),
        x.reshape(1, -1, *x.shape[2:]),
        x.new_empty(shape),
        None,
        module.stride,
        padding,
        module.dilation,
        False,
        [0] * (x.dim() - 2),
        b * module.groups,
        [False, True, False],
    )
    return grads.reshape(b, weight.shape[0], weight.shape[1], -1)


EMBEDDING_METHODS = ("ghost", "sorted")
GHOST_TOKENS = 64  # the ghost form up to this many indices per example: (B, T, T) Grams


def embedding(
    module: nn.Embedding,
    idx: Tensor,
    g: Tensor,
    w2: Weights = (None, None),
    method: str | None = None,
) -> Tensor:
    """nn.Embedding: idx (B, *) integer, g (B, *, dim). Two exact methods, neither with
    data-dependent shapes (so no device sync): the ghost form, Σ_{t,s} [i_t = i_s] g_t·g_s
    (a handful of ops, O(B·T²·dim)), for short sequences without a preconditioner; else
    sorted segment sums per example, O(B·T·dim) in some twenty ops. ``method`` forces one."""
    g = _as_work(g)
    b = g.shape[0]
    idx = idx.reshape(b, -1)
    t = idx.shape[1]
    g = g.reshape(b, t, -1)
    if module.padding_idx is not None:
        g = g * (idx != module.padding_idx).unsqueeze(-1).to(g.dtype)
    if t == 1:
        rows = idx[:, 0]
        return _sq(g[:, 0], (1,), None if w2[0] is None else w2[0][rows])
    if method is None:
        method = "ghost" if w2[0] is None and t <= GHOST_TOKENS else "sorted"
    if method == "ghost" and w2[0] is None:
        same = idx.unsqueeze(2) == idx.unsqueeze(1)  # (B, T, T): the same row
        return (torch.bmm(g, g.transpose(1, 2)) * same).sum((1, 2))
    sorted_idx, order = idx.sort(dim=1)
    gs = g.gather(1, order.unsqueeze(-1).expand_as(g))
    csum = gs.cumsum(1)
    t = idx.shape[1]
    is_end = torch.ones_like(sorted_idx, dtype=torch.bool)
    is_end[:, :-1] = sorted_idx[:, 1:] != sorted_idx[:, :-1]
    pos = torch.arange(t, device=idx.device).expand(b, t)
    ends = torch.where(is_end, pos, torch.full_like(pos, -1))
    prev_end = torch.cat([ends.new_full((b, 1), -1), ends[:, :-1].cummax(1).values], dim=1)
    before = csum.gather(1, prev_end.clamp(min=0).unsqueeze(-1).expand_as(csum))
    before = before * (prev_end >= 0).unsqueeze(-1).to(before.dtype)
    segments = csum - before  # at segment ends: the sum of g over one distinct row
    w2w = None if w2[0] is None else w2[0][sorted_idx]
    per_row = _sq(segments, (2,), w2w)
    return (per_row * is_end.to(per_row.dtype)).sum(1)


def layer_norm_stats(output: Tensor) -> tuple[Tensor, Tensor] | None:
    """The mean and 1/√(var + eps) a LayerNorm call normalised with, as its autograd node
    saved them (no computation; taken in the forward hook; ``batch_norm_stats``' twin). None
    where the node is not the native kernel's: they are then computed again from the input."""
    node = output.grad_fn
    if node is None or type(node).__name__ != "NativeLayerNormBackward0":
        return None
    mean, rstd = node._saved_result1, node._saved_result2  # type: ignore[attr-defined]
    nd = len(node._saved_normalized_shape)  # type: ignore[attr-defined]
    shape = (*output.shape[: output.dim() - nd], *(1,) * nd)
    if mean.shape != shape or rstd.shape != shape:
        return None
    return mean, rstd


def layer_norm(
    module: nn.LayerNorm,
    x: Tensor,
    g: Tensor,
    *,
    weight: bool,
    bias: bool,
    w2: Weights = (None, None),
    stats: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """nn.LayerNorm: x (B, *, *normalized_shape); ``stats``: the forward's (mean,
    1/√(var + eps)) when known (``layer_norm_stats``), else computed again."""
    x, g = _as_work(x), _as_work(g)
    nd = len(module.normalized_shape)
    if stats is not None:
        mean, rstd = (s.to(x.dtype) for s in stats)
        x_hat = (x - mean).mul_(rstd)
    else:
        dims = tuple(range(x.dim() - nd, x.dim()))
        mean = x.mean(dims, keepdim=True)
        var = x.var(dims, unbiased=False, keepdim=True)
        x_hat = (x - mean) * torch.rsqrt(var + module.eps)
    return _norm_affine(x_hat, g, nd, weight=weight, bias=bias, w2=w2)


def rms_norm(
    module: nn.Module, x: Tensor, g: Tensor, *, weight: bool, w2: Weights = (None, None)
) -> Tensor:
    """nn.RMSNorm (torch ≥ 2.4): x (B, *, *normalized_shape); only a weight."""
    x, g = _as_work(x), _as_work(g)
    nd = len(module.normalized_shape)  # type: ignore[arg-type]
    dims = tuple(range(x.dim() - nd, x.dim()))
    eps = module.eps if module.eps is not None else torch.finfo(x.dtype).eps  # type: ignore[attr-defined]
    x_hat = x * torch.rsqrt(x.square().mean(dims, keepdim=True) + eps)
    return _norm_affine(x_hat, g, nd, weight=weight, bias=False, w2=w2)


def _norm_affine(
    x_hat: Tensor, g: Tensor, nd: int, *, weight: bool, bias: bool, w2: Weights
) -> Tensor:
    """Parameters of shape normalized_shape (the last ``nd`` dims): sum over the middle dims."""
    b = g.shape[0]
    shape = (b, -1, *g.shape[g.dim() - nd :])
    g3 = g.reshape(shape)
    param_dims = tuple(range(1, 1 + nd))
    weight_sq = _sq((g3 * x_hat.reshape(shape)).sum(1), param_dims, w2[0]) if weight else None
    bias_sq = _sq(g3.sum(1), param_dims, w2[1]) if bias else None
    return _add(weight_sq, bias_sq, g3)


def _add(weight_sq: Tensor | None, bias_sq: Tensor | None, like: Tensor) -> Tensor:
    """The weight's and the bias's per-example squared norms together (no op for zeros)."""
    if weight_sq is None:
        return bias_sq if bias_sq is not None else like.new_zeros(like.shape[0])
    return weight_sq if bias_sq is None else weight_sq.add_(bias_sq)


def _channel_affine(x_hat: Tensor, g: Tensor, *, weight: bool, bias: bool, w2: Weights) -> Tensor:
    """Per-channel parameters (C,) of an input (B, C, *): sum over the spatial dims."""
    b, c = g.shape[0], g.shape[1]
    g3 = g.reshape(b, c, -1)
    weight_sq = _sq((g3 * x_hat.reshape(b, c, -1)).sum(2), (1,), w2[0]) if weight else None
    bias_sq = _sq(g3.sum(2), (1,), w2[1]) if bias else None
    return _add(weight_sq, bias_sq, g3)


def group_norm(
    module: nn.GroupNorm,
    x: Tensor,
    g: Tensor,
    *,
    weight: bool,
    bias: bool,
    w2: Weights = (None, None),
) -> Tensor:
    """nn.GroupNorm: x (B, C, *)."""
    x, g = _as_work(x), _as_work(g)
    b = x.shape[0]
    xg = x.reshape(b, module.num_groups, -1)
    mean = xg.mean(2, keepdim=True)
    var = xg.var(2, unbiased=False, keepdim=True)
    x_hat = ((xg - mean) * torch.rsqrt(var + module.eps)).reshape(x.shape)
    return _channel_affine(x_hat, g, weight=weight, bias=bias, w2=w2)


def batch_norm_stats(output: Tensor) -> tuple[Tensor, Tensor] | None:
    """The batch mean and 1/√(var + eps) a BatchNorm call in training mode normalised with,
    as its autograd node saved them for the backward pass (no computation; taken in the
    forward hook). None where the node is not the native kernel's (cuDNN, MIOpen, a compiled
    graph): the statistics are then computed again from the input."""
    node = output.grad_fn
    if node is None or type(node).__name__ != "NativeBatchNormBackward0":
        return None
    if not node._saved_training:  # type: ignore[attr-defined]
        return None
    mean, invstd = node._saved_result1, node._saved_result2  # type: ignore[attr-defined]
    c = output.shape[1] if output.dim() > 1 else 0
    if mean.shape != (c,) or invstd.shape != (c,):
        return None
    return mean, invstd


def batch_norm(
    module: nn.modules.batchnorm._BatchNorm,
    x: Tensor,
    g: Tensor,
    *,
    weight: bool,
    bias: bool,
    w2: Weights = (None, None),
    batch_stats: bool = True,
    stats: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """nn.BatchNorm1d/2d/3d: x (B, C) or (B, C, *). ``batch_stats``: whether the forward
    normalised with the batch's statistics (training) or the running ones (evaluation);
    ``stats``: that forward's (mean, 1/√(var + eps)) when known (``batch_norm_stats``).

    An example's weight gradient per channel is Σ_s g·(x − mean)·invstd: one centred input
    and two batched dot products, never a reduction over the batch dims with a stride (on the
    CPU ``var`` over (0, 2, 3) costs three times the BatchNorm's own forward).

    The examples of a batch are coupled through the batch statistics, so these per-example
    contributions sum to the gradient but are not independent draws (research note §6.11)."""
    x, g = _as_work(x), _as_work(g)
    b, c = g.shape[0], g.shape[1]
    g3 = g.reshape(b, c, -1)
    total = g3.new_zeros(b)
    if weight:
        x3 = x.reshape(b, c, -1)
        if stats is not None:
            mean, invstd = (s.to(x3.dtype) for s in stats)
            centred = x3 - mean.reshape(1, c, 1)
        elif batch_stats:
            mean = x3.sum((0, 2)) / (b * x3.shape[2])
            centred = x3 - mean.reshape(1, c, 1)
            var = torch.linalg.vecdot(centred, centred, dim=2).sum(0) / (b * x3.shape[2])
            invstd = torch.rsqrt(var + module.eps)
        else:
            mean = module.running_mean.to(x3.dtype)  # type: ignore[union-attr]
            invstd = torch.rsqrt(module.running_var.to(x3.dtype) + module.eps)  # type: ignore[union-attr, operator]
            centred = x3 - mean.reshape(1, c, 1)
        per_channel = torch.linalg.vecdot(g3, centred, dim=2) * invstd  # (B, C)
        total = total + _sq(per_channel, (1,), w2[0])
    if bias:
        total = total + _sq(g3.sum(2), (1,), w2[1])
    return total
