"""Per-example gradient norms of each supported layer against brute force (torch.func)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from bsmon.probes.noise import pernorms


def brute_force(module: nn.Module, x: torch.Tensor, g: torch.Tensor, w2=None) -> torch.Tensor:
    """Σ over the module's parameters of (w2 ⊙) the squared per-example gradient of
    ``<module(x_i), g_i>``: the contribution of example i when the output gradient is g."""
    params = {k: v.detach() for k, v in module.named_parameters()}

    def loss(p, xi, gi):
        out = functional_call(module, p, (xi.unsqueeze(0),))
        return (out * gi.unsqueeze(0)).sum()

    per = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, g)
    total = torch.zeros(x.shape[0], dtype=torch.float64)
    for name, value in per.items():
        sq = value.double().square()
        if w2 is not None:
            sq = sq * w2[name].double()
        total += sq.reshape(x.shape[0], -1).sum(1)
    return total


def output_grad(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = module(x)
    return torch.randn_like(out)


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a.double(), b.double(), rtol=1e-4, atol=1e-6)


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(6, 5), (6, 4, 5), (3, 2, 3, 5), (4, 40, 5)])
def test_linear(shape, bias):
    layer = nn.Linear(5, 3, bias=bias)
    x = torch.randn(*shape)
    g = output_grad(layer, x)
    term = pernorms.linear_input_term(x, bias) if x.dim() == 2 else None
    ours = pernorms.linear(None if term is not None else x, g, weight=True, bias=bias, x_term=term)
    close(ours, brute_force(layer, x, g))


def test_linear_weight_only_and_bias_only():
    layer = nn.Linear(5, 3)
    x = torch.randn(6, 7, 5)
    g = output_grad(layer, x)
    full = brute_force(layer, x, g)
    weight = pernorms.linear(x, g, weight=True, bias=False)
    bias = pernorms.linear(x, g, weight=False, bias=True)
    close(weight + bias, full)


@pytest.mark.parametrize("tokens", [3, 64])  # ghost form and materialised form
def test_linear_sequence_forms_agree(tokens, monkeypatch):
    layer = nn.Linear(8, 6)
    x = torch.randn(5, tokens, 8)
    g = output_grad(layer, x)
    close(pernorms.linear(x, g, weight=True, bias=True), brute_force(layer, x, g))
    monkeypatch.setattr(pernorms, "CHUNK_ELEMENTS", 100)  # force several chunks
    close(pernorms.linear(x, g, weight=True, bias=True), brute_force(layer, x, g))


@pytest.mark.parametrize(
    "make, shape",
    [
        (lambda: nn.Conv1d(3, 4, 3), (5, 3, 11)),
        (lambda: nn.Conv1d(4, 6, 4, stride=2, padding=1, dilation=2), (5, 4, 13)),
        (lambda: nn.Conv1d(4, 6, 3, padding="same", groups=2, padding_mode="circular"), (5, 4, 9)),
        (lambda: nn.Conv2d(3, 4, 3, padding=1), (4, 3, 8, 8)),
        (lambda: nn.Conv2d(4, 6, (3, 2), stride=(2, 1), dilation=(1, 2), bias=False), (4, 4, 9, 7)),
        (
            lambda: nn.Conv2d(4, 4, 3, padding="same", groups=4, padding_mode="reflect"),
            (3, 4, 6, 6),
        ),
        (lambda: nn.Conv2d(2, 8, 5, padding=2), (3, 2, 16, 16)),  # many positions: materialised
    ],
)
@pytest.mark.parametrize("method", pernorms.CONV_METHODS)
def test_conv(make, shape, method):
    layer = make()
    x = torch.randn(*shape)
    g = output_grad(layer, x)
    ours = pernorms.conv(layer, x, g, weight=True, bias=layer.bias is not None, method=method)
    close(ours, brute_force(layer, x, g))


@pytest.mark.parametrize("method", pernorms.EMBEDDING_METHODS)
@pytest.mark.parametrize("padding_idx", [None, 0])
@pytest.mark.parametrize("shape", [(7,), (7, 1), (6, 9), (4, 3, 5)])
def test_embedding(shape, padding_idx, method):
    layer = nn.Embedding(5, 4, padding_idx=padding_idx)  # few rows: many repeats
    idx = torch.randint(0, 5, shape)
    g = output_grad(layer, idx)
    # autograd leaves the padding row without gradient; so must the per-example norms
    close(pernorms.embedding(layer, idx, g, method=method), brute_force(layer, idx, g))


@pytest.mark.parametrize("shape, normalized", [((5, 6), 6), ((4, 3, 6), 6), ((4, 3, 2, 6), (2, 6))])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm(shape, normalized, bias):
    layer = nn.LayerNorm(normalized, bias=bias)
    with torch.no_grad():
        layer.weight.normal_()
    x = torch.randn(*shape)
    g = output_grad(layer, x)
    close(pernorms.layer_norm(layer, x, g, weight=True, bias=bias), brute_force(layer, x, g))


def test_rms_norm():
    layer = nn.RMSNorm(6)
    x = torch.randn(4, 3, 6)
    g = output_grad(layer, x)
    close(pernorms.rms_norm(layer, x, g, weight=True), brute_force(layer, x, g))


@pytest.mark.parametrize("shape", [(4, 6, 5), (4, 6, 3, 3), (4, 6)])
def test_group_norm(shape):
    layer = nn.GroupNorm(3, 6)
    x = torch.randn(*shape)
    g = output_grad(layer, x)
    close(pernorms.group_norm(layer, x, g, weight=True, bias=True), brute_force(layer, x, g))


def per_example_copies_bn(layer, x, g, training):
    """BatchNorm couples the examples, so vmap does not apply; give every example its own copy
    of the affine parameters instead: the gradient of each copy is that example's share."""
    b, c = x.shape[0], x.shape[1]
    shape = (b, c) + (1,) * (x.dim() - 2)
    weight = layer.weight.detach().expand(b, c).clone().requires_grad_()
    bias = layer.bias.detach().expand(b, c).clone().requires_grad_()
    normed = F.batch_norm(
        x, layer.running_mean.clone(), layer.running_var.clone(), training=training, eps=layer.eps
    )
    out = normed * weight.reshape(shape) + bias.reshape(shape)
    (out * g).sum().backward()
    return weight.grad.double().square().sum(1) + bias.grad.double().square().sum(1)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize(
    "make, shape",
    [(nn.BatchNorm1d, (6, 4)), (nn.BatchNorm1d, (6, 4, 5)), (nn.BatchNorm2d, (5, 4, 3, 3))],
)
def test_batch_norm(make, shape, training):
    layer = make(4)
    with torch.no_grad():
        layer.weight.normal_()
        layer.bias.normal_()
        layer.running_mean.normal_()
        layer.running_var.uniform_(0.5, 2)
    x = torch.randn(*shape)
    g = torch.randn(*shape)
    ours = pernorms.batch_norm(layer, x, g, weight=True, bias=True, batch_stats=training)
    expected = per_example_copies_bn(layer, x, g, training)
    close(ours, expected)
    layer.train(training)
    out = layer(x.clone().requires_grad_())
    stats = pernorms.batch_norm_stats(out)  # what the forward saved for its backward pass
    assert (stats is not None) == training
    flags = {"weight": True, "bias": True, "batch_stats": training}
    close(pernorms.batch_norm(layer, x, g, stats=stats, **flags), expected)
    with torch.no_grad():
        assert pernorms.batch_norm_stats(layer(x)) is None  # no autograd node, nothing saved


def test_batch_norm_far_from_zero():
    """An input whose mean is far from zero against its spread: the input is centred before
    the products, so nothing cancels."""
    layer = nn.BatchNorm2d(3)
    x = 100 + 0.1 * torch.randn(8, 3, 4, 4)
    g = torch.randn(8, 3, 4, 4)
    stats = pernorms.batch_norm_stats(layer(x.clone().requires_grad_()))
    expected = per_example_copies_bn(copy.deepcopy(layer).double(), x.double(), g.double(), True)
    for given in (None, stats):
        ours = pernorms.batch_norm(layer, x, g, weight=True, bias=True, stats=given)
        torch.testing.assert_close(ours.double(), expected, rtol=1e-3, atol=1e-6)


def test_preconditioned_weights():
    """With per-parameter weights w2 every form returns Σ w2 ⊙ c_i²."""
    cases = [
        (nn.Linear(5, 3), torch.randn(6, 5)),
        (nn.Linear(5, 3), torch.randn(6, 4, 5)),
        (nn.Conv2d(2, 4, 3, groups=2), torch.randn(3, 2, 6, 6)),
        (nn.LayerNorm(5), torch.randn(4, 3, 5)),
        (nn.GroupNorm(2, 4), torch.randn(3, 4, 5)),
    ]
    for layer, x in cases:
        g = output_grad(layer, x)
        w2 = {k: torch.rand_like(v) for k, v in layer.named_parameters()}
        pair = (w2["weight"], w2.get("bias"))
        if isinstance(layer, nn.Linear):
            ours = pernorms.linear(x, g, weight=True, bias=True, w2=pair)
        elif isinstance(layer, nn.Conv2d):
            ours = pernorms.conv(layer, x, g, weight=True, bias=True, w2=pair)
            grouped = pernorms.conv(layer, x, g, weight=True, bias=True, w2=pair, method="grouped")
            close(grouped, ours)
        elif isinstance(layer, nn.LayerNorm):
            ours = pernorms.layer_norm(layer, x, g, weight=True, bias=True, w2=pair)
        else:
            ours = pernorms.group_norm(layer, x, g, weight=True, bias=True, w2=pair)
        close(ours, brute_force(layer, x, g, w2))
    layer = nn.Embedding(5, 4)
    idx = torch.randint(0, 5, (6, 7))
    g = output_grad(layer, idx)
    w2 = {"weight": torch.rand(5, 4)}
    close(pernorms.embedding(layer, idx, g, (w2["weight"], None)), brute_force(layer, idx, g, w2))


def test_half_precision_inputs_are_summed_in_float32():
    layer = nn.Linear(5, 3)
    x = torch.randn(6, 5)
    g = output_grad(layer, x)
    ours = pernorms.linear(x.half(), g.half(), weight=True, bias=True)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours.double(), brute_force(layer, x, g), rtol=5e-3, atol=1e-3)
