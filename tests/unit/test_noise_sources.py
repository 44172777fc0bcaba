"""The training-thread sources, step by step, against brute force (torch.func / autograd).

A model with every supported layer goes through the per-example hooks; the step's record
must carry Σ_i |c_i|² and |Σ_i c_i|² over the measured parameters exactly as per-sample
gradients give them — raw and Adam-preconditioned. The micro-batch hooks likewise, per
backward pass.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from bsmon.probes.noise.autograd import ExampleCounter
from bsmon.probes.noise.microbatch import MicrobatchSource
from bsmon.probes.noise.per_example import PerExampleSource
from bsmon.probes.noise.scaling import AdamPreconditioner, LossScale
from bsmon.probes.noise.step_record import read
from bsmon.probes.runtime.fault_guard import FaultGuard
from bsmon.probes.runtime.forward_watch import ForwardWatch

TOKENS = 5


class Zoo(nn.Module):
    """Every supported layer once, plus a raw parameter bsmon cannot measure."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 8, padding_idx=0)
        self.ln = nn.LayerNorm(8)
        self.seq = nn.Linear(8, 6)
        self.conv1 = nn.Conv1d(6, 4, 3, padding=1)
        self.gn = nn.GroupNorm(2, 4)
        self.rms = nn.RMSNorm(4)
        self.img = nn.Conv2d(1, 3, 3)
        self.bn = nn.BatchNorm1d(3)
        self.head = nn.Linear(4 * TOKENS + 3, 2)
        self.extra = nn.Parameter(torch.ones(2))

    def forward(self, tokens: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        h = self.ln(self.emb(tokens))
        h = torch.relu(self.seq(h))
        h = self.gn(self.conv1(h.transpose(1, 2)))
        h = self.rms(h.transpose(1, 2))
        i = self.bn(self.img(image).mean((2, 3)))
        return self.head(torch.cat([h.flatten(1), i], 1)) * self.extra


def quiet_guard() -> FaultGuard:
    return FaultGuard(lambda _event: None, lambda: 0)


def source_options(precond=None) -> dict:
    return {
        "guard": quiet_guard(),
        "loss_scale": LossScale(None),
        "precond": precond,
        "emit": lambda *_: None,
    }


_watches: list[ForwardWatch] = []


@pytest.fixture(autouse=True)
def _close_watches():
    """No test leaves a global forward hook behind."""
    yield
    while _watches:
        _watches.pop().close()


def armed_watch(model) -> ForwardWatch:
    watch = ForwardWatch(model, quiet_guard())
    watch.arm()  # as the monitor does after the job's first step
    _watches.append(watch)
    return watch


def per_example_source(model, precond=None, **options) -> PerExampleSource:
    """A source measuring every step, on a watch of its own."""
    options = source_options(precond) | options
    source = PerExampleSource(
        model, list(model.parameters()), armed_watch(model), lambda: None, **options
    )
    source.set_measuring(True)
    return source


def micro_batch_source(model) -> MicrobatchSource:
    counter = ExampleCounter(armed_watch(model), "test")
    source = MicrobatchSource(list(model.parameters()), counter, lambda: None, **source_options())
    source.set_measuring(True)
    return source


def zoo_batch(batch: int = 6):
    torch.manual_seed(1)
    tokens = torch.randint(0, 11, (batch, TOKENS))
    image = torch.randn(batch, 1, 6, 6)
    weights = torch.randn(batch, 2)
    return tokens, image, weights


def brute_force(model, names, tokens, image, weights, w2=None):
    """(Σ_i |c_i|², |Σ_i c_i|²) over the named parameters, from per-sample gradients."""
    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = {k: v.detach() for k, v in model.named_buffers()}

    def loss(p, t, im, w):
        out = functional_call(model, (p, buffers), (t.unsqueeze(0), im.unsqueeze(0)))
        return (out * w.unsqueeze(0)).sum()

    per = vmap(grad(loss), in_dims=(None, 0, 0, 0))(params, tokens, image, weights)
    a = q = 0.0
    for name in names:
        g = per[name].double()
        weight = 1.0 if w2 is None else w2[name].double()
        a += float((g.square() * weight).sum())
        q += float((g.sum(0).square() * weight).sum())
    return a, q


def test_per_example_record_matches_per_sample_gradients():
    model = Zoo().eval()  # BatchNorm on running statistics: examples independent
    model.bn.running_var.uniform_(0.5, 2.0)
    trainable = list(model.parameters())
    source = per_example_source(model)
    names = [n for n, p in model.named_parameters() if n != "extra"]
    assert {id(p) for p in source.params} == {
        id(p) for n, p in model.named_parameters() if n != "extra"
    }
    assert source.coverage == pytest.approx(1 - 2 / sum(p.numel() for p in trainable))
    assert source.discovery.left_out == {"Zoo": 2}
    assert source.detail().endswith("(not measured: Zoo)")

    tokens, image, weights = zoo_batch()
    (model(tokens, image) * weights).sum().backward()
    record = source.take_record(1)
    total, scale, sq_sum = read(record.values)
    expected_a, expected_q = brute_force(model, names, tokens, image, weights)
    assert scale == 1.0 and record.examples == 6 and record.units == ((6, 1.0, 1.0),)
    assert sq_sum == pytest.approx(expected_a, rel=1e-4)
    assert total == pytest.approx(expected_q, rel=1e-4)
    source.close()
    assert not any(m._forward_hooks for m in model.modules())
    assert not nn.modules.module._global_forward_hooks


def test_adam_preconditioned_record_matches_weighted_per_sample_gradients():
    model = Zoo().eval()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    precond = AdamPreconditioner(optimizer)
    source = per_example_source(model, precond)
    tokens, image, weights = zoo_batch()
    for _ in range(2):  # Adam state after two steps
        (model(tokens, image) * weights).sum().backward()
        first = source.take_record(1)
        optimizer.step()
        optimizer.zero_grad()
    assert first is not None
    w2 = {}
    for name, p in model.named_parameters():
        state = optimizer.state[p]
        v_hat = state["exp_avg_sq"] / (1 - 0.999 ** float(state["step"]))
        w2[name] = 1 / (v_hat.sqrt() + 1e-8) ** 2
    names = [n for n, _ in model.named_parameters() if n != "extra"]
    (model(tokens, image) * weights).sum().backward()
    record = source.take_record(3)
    assert record.problem is None
    total, _scale, sq_sum = read(record.values)
    expected_a, expected_q = brute_force(model, names, tokens, image, weights, w2)
    assert sq_sum == pytest.approx(expected_a, rel=1e-3)
    assert total == pytest.approx(expected_q, rel=1e-3)


def test_preconditioning_needs_adam_state_first():
    model = Zoo().eval()
    precond = AdamPreconditioner(torch.optim.AdamW(model.parameters()))
    source = per_example_source(model, precond)
    tokens, image, weights = zoo_batch()
    (model(tokens, image) * weights).sum().backward()
    assert "Adam state" in source.take_record(1).problem
    with pytest.raises(ValueError, match="Adam-family"):
        AdamPreconditioner(torch.optim.SGD(model.parameters(), lr=0.1))


def test_micro_batch_record_per_backward_pass():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    trainable = list(model.parameters())
    source = micro_batch_source(model)
    sizes = [5, 7, 4]
    batches = [torch.randn(n, 4) for n in sizes]
    contributions = []
    for x in batches:
        loss = model(x).square().sum()
        contributions.append(torch.autograd.grad(loss, trainable, retain_graph=True))
        loss.backward()
    record = source.take_record(1)
    total, _scale, *units = read(record.values)
    assert record.examples == sum(sizes)
    assert record.units == tuple((1, float(n), 1.0) for n in sizes)
    for value, c in zip(units, contributions, strict=True):
        assert value == pytest.approx(sum(float(t.double().square().sum()) for t in c), rel=1e-5)
    summed = [sum(parts) for parts in zip(*contributions, strict=True)]
    assert total == pytest.approx(sum(float(t.double().square().sum()) for t in summed), rel=1e-5)
    assert source.detail() == "3 micro-batches per step"


def test_a_single_backward_pass_is_no_micro_batch():
    model = nn.Linear(3, 1)
    source = micro_batch_source(model)
    model(torch.randn(4, 3)).sum().backward()
    assert "gradient accumulation" in source.take_record(1).problem


def test_the_loss_scale_is_carried_for_the_agent_to_divide_out():
    model = nn.Linear(3, 1)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    source = per_example_source(model, loss_scale=LossScale(scaler))
    scaler.scale(model(torch.randn(4, 3)).sum()).backward()
    total, scale, _sq_sum = read(source.take_record(1).values)
    assert scale == 256.0
    scaler.unscale_(optimizer)
    unscaled = sum(float(p.grad.square().sum()) for p in model.parameters())
    assert total / scale**2 == pytest.approx(unscaled, rel=1e-5)


# -- the batch dimension comes from the model's input, not from a layer ------------------------


class TinyGPT(nn.Module):
    """Token and position embeddings (the position one indexed with ``arange(T)``, broadcast
    over the batch), a block with LayerNorm and Linear layers, a head."""

    def __init__(self, vocab: int = 13, width: int = 8, block: int = 6) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(block, width)
        self.ln = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1])
        h = self.wte(idx) + self.wpe(positions)
        return self.head(torch.tanh(self.fc(self.ln(h))))


class SequenceFirstLM(nn.Module):
    """An LSTM language model on (T, B) token ids, as in PyTorch's word_language_model."""

    def __init__(self, vocab: int = 11, width: int = 6) -> None:
        super().__init__()
        self.encoder = nn.Embedding(vocab, width)
        self.rnn = nn.LSTM(width, width)
        self.decoder = nn.Linear(width, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.encoder(idx))
        return self.decoder(out)


def per_sample_terms(model, names, inputs, targets, batch_dim: int):
    """(Σ_i |c_i|², |Σ_i c_i|²) over the named parameters, examples along ``batch_dim``."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, x, y):
        x, y = x.unsqueeze(batch_dim), y.unsqueeze(batch_dim)
        out = functional_call(model, p, (x,))
        return nn.functional.cross_entropy(
            out.reshape(-1, out.shape[-1]), y.reshape(-1), reduction="sum"
        )

    per = vmap(grad(loss), in_dims=(None, batch_dim, batch_dim))(params, inputs, targets)
    a = sum(float(per[n].double().square().sum()) for n in names)
    q = sum(float(per[n].double().sum(0).square().sum()) for n in names)
    return a, q


def measured_step(model, source, inputs, targets):
    out = model(inputs)
    nn.functional.cross_entropy(
        out.reshape(-1, out.shape[-1]), targets.reshape(-1), reduction="sum"
    ).backward()
    return source.take_record(1)


@pytest.mark.parametrize("tokens", [6, 4], ids=["T=6", "T=batch"])
def test_a_broadcast_position_embedding_is_left_out_by_name(tokens):
    torch.manual_seed(0)
    model = TinyGPT()
    events = []
    source = per_example_source(model, emit=lambda message, level: events.append(message))
    batch = 4
    idx = torch.randint(0, 13, (batch, tokens))
    targets = torch.randint(0, 13, (batch, tokens))
    # left out during the backward pass, before the step's |G|² is taken: the step holds
    record = measured_step(model, source, idx, targets)
    assert any("left out wpe.weight" in e and "no batch dimension" in e for e in events)
    assert "wpe" not in {layer.name for layer in source.layers}
    assert record.problem is None and record.examples == batch  # examples, not positions
    total, _scale, sq_sum = read(record.values)
    names = [n for n, _ in model.named_parameters() if not n.startswith("wpe")]
    expected_a, expected_q = per_sample_terms(model, names, idx, targets, batch_dim=0)
    assert sq_sum == pytest.approx(expected_a, rel=1e-4)
    assert total == pytest.approx(expected_q, rel=1e-4)


@pytest.mark.filterwarnings("ignore:There is a performance drop")
def test_sequence_first_inputs_are_measured_over_the_batch_dim():
    torch.manual_seed(0)
    model = SequenceFirstLM()
    source = per_example_source(model)
    steps, batch = 7, 3  # (T, B): dim 0 holds time steps
    idx = torch.randint(0, 11, (steps, batch))
    targets = torch.randint(0, 11, (steps, batch))
    record = measured_step(model, source, idx, targets)
    assert record.problem is None and record.examples == batch
    assert {layer.name for layer in source.layers} == {"encoder", "decoder"}
    total, _scale, sq_sum = read(record.values)
    names = [n for n, _ in model.named_parameters() if not n.startswith("rnn")]
    expected_a, expected_q = per_sample_terms(model, names, idx, targets, batch_dim=1)
    assert sq_sum == pytest.approx(expected_a, rel=1e-4)
    assert total == pytest.approx(expected_q, rel=1e-4)


class SequenceFirstNormedLM(SequenceFirstLM):
    """The LSTM language model with a LayerNorm on its (T, B, C) embeddings: the statistics
    its forward saved are shaped as that input, with the examples along dim 1."""

    def __init__(self, vocab: int = 11, width: int = 6) -> None:
        super().__init__(vocab, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.norm(self.encoder(idx)))
        return self.decoder(out)


def test_a_sequence_first_layer_norm_is_measured_with_its_forwards_statistics():
    torch.manual_seed(0)
    model = SequenceFirstNormedLM()
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 1.5)
    source = per_example_source(model)
    steps, batch = 7, 3
    idx = torch.randint(0, 11, (steps, batch))
    targets = torch.randint(0, 11, (steps, batch))
    record = measured_step(model, source, idx, targets)
    assert record.problem is None and record.examples == batch
    assert {layer.name for layer in source.layers} == {"encoder", "norm", "decoder"}
    total, _scale, sq_sum = read(record.values)
    names = [n for n, _ in model.named_parameters() if not n.startswith("rnn")]
    expected_a, expected_q = per_sample_terms(model, names, idx, targets, batch_dim=1)
    assert sq_sum == pytest.approx(expected_a, rel=1e-4)
    assert total == pytest.approx(expected_q, rel=1e-4)


class Conv1D(nn.Module):
    """Hugging Face's GPT-2 projection: a linear layer with its weight stored (in, out)."""

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.nf, self.nx = nf, nx
        self.weight = nn.Parameter(0.1 * torch.randn(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)
        return out.view(*x.shape[:-1], self.nf)


class GPT2Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = Conv1D(12, 6)
        self.proj = Conv1D(5, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.tanh(self.attn(x)))


@pytest.mark.parametrize("shape", [(5, 6), (5, 4, 6)], ids=["2-D", "sequence"])
@pytest.mark.parametrize("adam", [False, True])
def test_hugging_faces_conv1d_is_measured_as_a_linear_layer(shape, adam):
    model = GPT2Block()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    precond = AdamPreconditioner(optimizer) if adam else None
    source = per_example_source(model, precond)
    assert source.coverage == 1.0
    x, w = torch.randn(*shape), torch.randn(*shape[:-1], 5)
    for step in range(2 if adam else 1):  # Adam state after one step
        (model(x) * w).sum().backward()
        record = source.take_record(step + 1)
        optimizer.step()
        optimizer.zero_grad()
    w2 = {}
    if adam:
        for name, p in model.named_parameters():
            v_hat = optimizer.state[p]["exp_avg_sq"] / (
                1 - 0.999 ** float(optimizer.state[p]["step"])
            )
            w2[name] = 1 / (v_hat.sqrt() + 1e-8) ** 2
    (model(x) * w).sum().backward()
    record = source.take_record(3)
    total, _scale, sq_sum = read(record.values)
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, xi, wi):
        return (functional_call(model, p, (xi.unsqueeze(0),)) * wi.unsqueeze(0)).sum()

    per = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, w)
    a = sum(float((per[n].double().square() * w2.get(n, 1.0)).sum()) for n in params)
    q = sum(float((per[n].double().sum(0).square() * w2.get(n, 1.0)).sum()) for n in params)
    assert sq_sum == pytest.approx(a, rel=1e-4) and total == pytest.approx(q, rel=1e-4)
