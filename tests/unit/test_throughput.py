"""Tokens per second and MFU (docs/throughput.md): the FLOPs counted on the meta device match
a hand count of a GPT, the peak comes from the table by name and precision, tokens stay
exact when the batch size changes, and a CPU job says why it has no MFU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bsmon.probes import attach
from bsmon.probes.throughput.extension import NOT_TOKENS, sequence_length
from bsmon.probes.throughput.flops import InputShapes, training_flops
from bsmon.probes.throughput.peak import peak_flops
from tests.helpers import wait_until

VOCAB, CONTEXT, WIDTH, HEADS, LAYERS = 96, 32, 64, 4, 2


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.up, self.down = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (
            z.view(b, t, HEADS, c // HEADS).transpose(1, 2)
            for z in self.qkv(self.ln1(x)).split(c, dim=2)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class TinyGPT(nn.Module):
    """nanoGPT's shape: token and position embeddings, pre-norm blocks, a tied head, and a
    forward that returns (logits, loss) given targets."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(VOCAB, WIDTH), nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.tokens.weight

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def hand_count(model: nn.Module, examples: int, seq_len: int) -> float:
    """6·N per token (N: the matmuls' weights, the tied head once) plus attention's two
    batched matmuls, 2·T·d each per token and layer forward, three times for forward and
    backward: 12·L·T·d per token."""
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    tokens = examples * seq_len
    return 6 * weights * tokens + 12 * LAYERS * seq_len * WIDTH * tokens


@pytest.mark.parametrize("with_targets", [True, False])
def test_the_flops_counted_on_the_meta_device_match_a_hand_count_of_a_gpt(with_targets):
    model = TinyGPT()
    idx = torch.randint(VOCAB, (4, CONTEXT))
    kwargs = {"targets": idx} if with_targets else {}
    per_example, why = training_flops(model, InputShapes.of((idx,), kwargs, 4))
    assert why is None
    assert per_example == pytest.approx(hand_count(model, 1, CONTEXT), rel=0.05)
    assert all(p.device.type == "cpu" for p in model.parameters())  # the model untouched
    assert not model.blocks[0].qkv.weight.grad


def test_a_model_that_reads_its_values_has_no_flops_and_says_why():
    class Branchy(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) if x.sum().item() > 0 else x

    per_example, why = training_flops(Branchy(4, 4), InputShapes.of((torch.ones(2, 4),), {}, 2))
    assert per_example is None and "did not run on the meta device" in why


@pytest.mark.parametrize(
    ("device", "dtype", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.5),
        ("NVIDIA H100 PCIe", "bf16", 756.0),
        ("NVIDIA H100 NVL", "fp16", 835.5),
        ("NVIDIA H200", "tf32", 494.5),
        ("NVIDIA A100-SXM4-80GB", "tf32", 156.0),
        ("NVIDIA A100 80GB PCIe", "fp32", 19.5),
        ("NVIDIA L4", "bf16", 121.0),
        ("NVIDIA L40S", "bf16", 362.0),
        ("Tesla V100-SXM2-16GB", "tf32", 15.7),  # no TF32 cores: FP32's peak
        ("Tesla T4", "fp16", 65.0),
    ],
)
def test_the_peak_is_read_by_the_device_s_name_and_precision(device, dtype, tflops):
    assert peak_flops(device, dtype) == (pytest.approx(tflops * 1e12), None)


@pytest.mark.parametrize(
    ("device", "dtype", "said"),
    [
        ("Tesla V100-SXM2-16GB", "bf16", "has no bf16 peak"),
        ("NVIDIA A10G", "bf16", "no peak FLOP/s for NVIDIA A10G"),  # not the A10's figures
        ("NVIDIA L40", "bf16", "no peak FLOP/s for NVIDIA L40"),  # neither the L4's nor L40S's
    ],
)
def test_a_device_or_precision_not_in_the_table_has_no_peak_and_says_so(device, dtype, said):
    peak, why = peak_flops(device, dtype)
    assert peak is None and said in why


def test_the_sequence_is_the_dimension_beside_the_batch_of_token_ids():
    ids = torch.zeros(8, 128, dtype=torch.long)
    assert sequence_length(ids, 0) == 128
    assert sequence_length(ids.T, 1) == 128  # sequence-first
    assert sequence_length(torch.zeros(8, 128), 0) is None  # features, not tokens
    assert sequence_length(torch.zeros(8, 3, 32, 32, dtype=torch.uint8), 0) is None


def train(mon, model, optimizer, steps: int) -> list[int]:
    """``steps`` steps of ``mon.batch_size`` sequences cut by hand; their sizes."""
    sizes = []
    for _ in range(steps):
        idx = torch.randint(VOCAB, (mon.batch_size, CONTEXT))
        _, loss = model(idx, idx)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        sizes.append(idx.shape[0])
    return sizes


def throughput_after(mon, samples: int) -> dict:
    def caught_up() -> dict | None:
        mon.flush()
        stats = mon.stats()
        return stats["throughput"] if stats["samples"] == samples else None

    return wait_until(  # a machine busy with other jobs slows the agent: progress, not seconds
        caught_up,
        message=f"the agent to count {samples} samples",
        progress=lambda: mon.stats()["samples"],
    )


def test_tokens_stay_exact_when_the_batch_size_changes_and_a_cpu_job_has_no_mfu(bsmon_dir):
    torch.manual_seed(0)
    model = TinyGPT()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, optimizer, batch_size=4, serve=False, record=False) as mon:
        sizes = train(mon, model, optimizer, 12)
        assert throughput_after(mon, sum(sizes))["tokens"] == sum(sizes) * CONTEXT
        assert mon.request_batch_size(8)
        sizes += train(mon, model, optimizer, 12)
        samples = sum(sizes)
        reading = throughput_after(mon, samples)
        stats = mon.stats()
    assert sizes[0] == 4 and sizes[-1] == 8
    assert reading["seq_len"] == CONTEXT and reading["tokens"] == samples * CONTEXT
    assert reading["tokens_per_s"] == pytest.approx(stats["samples_per_s"] * CONTEXT)
    assert reading["tokens_note"] is None
    # no peak to compare with: the FLOPs are not counted (a second of the job's host for
    # nothing), and MFU says why
    assert reading["flops_per_sample"] is None and reading["flops_per_s"] is None
    assert reading["mfu"] is None and reading["dtype"] == "fp32"
    assert reading["mfu_note"] == "MFU n/a: the model runs on the CPU (no peak FLOP/s)"
    said = throughput_events(mon)
    assert len(said) == 1, said  # said once: the batch-size change changes no figure per example
    assert said[0].message == (
        f"{CONTEXT} tokens per example · MFU n/a: the model runs on the CPU (no peak FLOP/s)"
    )
    assert said[0].data["seq_len"] == CONTEXT


def throughput_events(mon) -> list:
    return [event for event in mon.job.telemetry.events if event.kind == "throughput"]


def test_a_model_whose_input_is_not_token_ids_has_no_tokens_and_says_why(bsmon_dir):
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    with attach(model, optimizer, batch_size=8, serve=False, record=False) as mon:
        for _ in range(12):
            F.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
        reading = throughput_after(mon, 12 * 8)
    assert reading["tokens"] is None and reading["tokens_per_s"] is None
    assert reading["tokens_note"] == NOT_TOKENS


def test_a_first_layer_whose_input_needs_no_gradient_is_counted_as_it_runs():
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    per_example, _ = training_flops(model, InputShapes.of((torch.randn(8, 16),), {}, 8))
    # forward 2, weight gradient 2, input gradient 2 per weight; the input needs none
    assert per_example == (2 + 2) * 16 * 32 + (2 + 2 + 2) * 32 * 1


def test_a_sequence_length_that_varies_has_no_tokens_and_says_why(bsmon_dir):
    model = TinyGPT()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, optimizer, batch_size=4, serve=False, record=False) as mon:
        for step in range(12):
            idx = torch.randint(VOCAB, (4, CONTEXT - step % 3))  # padded to each batch's longest
            model(idx, idx)[1].backward()
            optimizer.step()
            optimizer.zero_grad()
        reading = throughput_after(mon, 12 * 4)
    assert reading["tokens"] is None and reading["mfu"] is None
    assert reading["tokens_note"].startswith("the model's input varies in shape")
    assert reading["mfu_note"] == reading["tokens_note"]
    last = throughput_events(mon)[-1].message
    assert last == f"tokens and MFU n/a from now: {reading['tokens_note']}"


def test_each_rank_s_summary_carries_its_own_device_s_tokens_and_mfu():
    from bsmon.probes.runtime.ranks import rank_summary
    from bsmon.probes.wire import protocol

    metrics = protocol.Metrics(
        t=0.0, step=9, batch_size=8, step_time_s=0.1, samples_per_s=80.0, b_simple=None
    )
    assert rank_summary(metrics)["tokens_per_s"] is None  # an agent without the reading
    metrics.throughput = protocol.ThroughputReading(tokens_per_s=80.0 * CONTEXT, mfu=0.25)
    summary = rank_summary(metrics)
    assert summary["tokens_per_s"] == 80.0 * CONTEXT and summary["mfu"] == 0.25
    assert protocol.RankReading(rank=1, **summary).tokens_per_s == 80.0 * CONTEXT


def test_a_failure_of_the_reading_is_reported_and_the_rest_of_the_message_goes_on(
    bsmon_dir, monkeypatch
):
    from bsmon.probes.throughput import extension

    def broken(*_args):
        raise RuntimeError("a bug of bsmon's")

    monkeypatch.setattr(extension, "_device_peak", broken)
    model = TinyGPT()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, optimizer, batch_size=4, serve=False, record=False) as mon:
        sizes = train(mon, model, optimizer, 12)
        reading = throughput_after(mon, sum(sizes))
        assert mon.stats()["samples_per_s"] is not None  # the message still made

        def reported() -> list:
            mon.flush()  # the event the failure made is drained by the tick after it
            return [e for e in mon.job.telemetry.events if e.kind == "agent_error"]

        errors = wait_until(reported, message="the failure reported")
    assert reading["mfu_note"] == "not measured: bsmon's own error (RuntimeError)"
    assert len(errors) == 1 and "tokens/s and MFU" in errors[0].message


def test_on_a_gpu_in_the_table_mfu_is_the_achieved_flops_over_its_peak(monkeypatch):
    """The GPU path without a GPU: a look that saw a bf16 call on cuda:0, named an H200 (the
    device's name is all the table reads); MFU = samples/s × FLOPs per example / 989.5 TFLOP/s,
    at one batch size and at another."""
    from bsmon.probes.runtime.context import JobContext
    from bsmon.probes.runtime.fault_guard import FaultGuard
    from bsmon.probes.runtime.forward_watch import ForwardWatch
    from bsmon.probes.runtime.progress import Progress
    from bsmon.probes.throughput.extension import Seen, ThroughputExtension
    from bsmon.probes.wire import protocol

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda _device: "NVIDIA H200")
    model, events = TinyGPT(), []
    progress = Progress()
    guard = FaultGuard(events.append, progress)
    part = ThroughputExtension(
        ForwardWatch(model, guard), model, JobContext(progress, events.append, guard, None)
    )
    idx = torch.zeros(4, CONTEXT, dtype=torch.long)
    call = InputShapes.of((idx, idx), {}, 4)
    part._look.seen.append(Seen((CONTEXT,), CONTEXT, call, "bf16", torch.device("cuda", 0)))
    part.on_tick(None)
    per_example = hand_count(model, 1, CONTEXT)
    for rate in (100.0, 400.0):  # samples/s at one batch size, then at four times it
        metrics = protocol.Metrics(
            t=0.0, step=9, batch_size=8, step_time_s=0.1, samples_per_s=rate, b_simple=None
        )
        reading = part.metrics_part(metrics)["throughput"]
        assert reading.mfu == pytest.approx(rate * per_example / 989.5e12, rel=0.05)
        assert reading.tokens_per_s == rate * CONTEXT
        assert (reading.device, reading.dtype, reading.mfu_note) == ("NVIDIA H200", "bf16", None)
    said = [event.message for event in events if event.kind == "throughput"]
    assert said == [
        f"{CONTEXT} tokens per example · {per_example / 1e6:.3g} MFLOP per example (meta device)"
        " · MFU against NVIDIA H200 bf16 (990 TFLOP/s)"
    ]


def test_the_summary_keeps_the_tokens_and_says_them_beside_the_samples(bsmon_dir):
    from bsmon.probes.summary.build import summarize_record
    from bsmon.probes.summary.markdown import _token_rows
    from bsmon.probes.summary.schema import Throughput

    torch.manual_seed(0)
    model = TinyGPT()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, optimizer, batch_size=4, serve=False) as mon:
        samples = sum(train(mon, model, optimizer, 24))
        throughput_after(mon, samples)
        record = mon.session.record
    tp = summarize_record(record).throughput
    assert tp.tokens == samples * CONTEXT
    assert tp.tokens_per_s == pytest.approx(tp.samples_per_s * CONTEXT, rel=1e-5)
    assert tp.mfu_mean is None  # a CPU: no peak
    (tokens,) = _token_rows(tp)
    assert tokens[0] == "tokens" and f"({samples * CONTEXT:,} trained)" in tokens[1]
    on_a_gpu = _token_rows(Throughput(tokens=10, tokens_per_s=5.0, mfu_mean=0.412))
    assert on_a_gpu[1] == ("MFU", "41.2% mean (model FLOPs over the device's peak)")


def test_the_demo_s_sequence_model_has_its_tokens_counted(bsmon_dir):
    """``bsmon demo --model lm``: what the README's sequence screenshot shows."""
    from bsmon.probes import demo

    torch.manual_seed(0)
    model, loss_fn = demo.DemoLM(), demo.TokenLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with attach(model, optimizer, batch_size=16, serve=False, record=False) as mon:
        batches = mon.dataloader(demo.make_text_dataset(256), shuffle=True)
        for _, (x, y) in zip(range(6), batches, strict=False):
            loss_fn(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
        reading = throughput_after(mon, 6 * 16)
    assert reading["seq_len"] == demo.CONTEXT and reading["tokens"] == 6 * 16 * demo.CONTEXT
    assert reading["mfu"] is None and "CPU" in reading["mfu_note"]
