"""MFU against a hand count (issue 45): the GPT-style model of the probe check (6 layers, width
384, 256 tokens, vocabulary 8192) trains in bf16 with the agent attached, and the agent's MFU —
its FLOPs per example, counted once on the meta device, × its samples/s, over the device's
dense bf16 peak from its table — is set against a count by hand of the same run: 6·N + 12·L·T·d
FLOPs per token (the matmuls' parameters N, forward and backward; attention's two matmuls per
layer over T positions of width d: Kaplan et al. 2020, PaLM's appendix B), × the tokens per
second measured over synchronize-bracketed blocks, over the same peak. Goal: within 5%.

``measure`` runs on a CPU too, where the agent has no peak and so no MFU: the test passes it
one (tests/processes/test_gpu_check.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from .procs import Deadline
from .report import Criterion, Finding, Table

GOAL = 0.05
GPU_BATCH = 16
WARMUP = 10
STEPS = 40


@dataclass(frozen=True)
class Shape:
    layers: int = 6
    width: int = 384
    context: int = 256
    vocab: int = 8192
    heads: int = 6


GPT = Shape()  # the probe check's


def hand_flops_per_token(model: Any, layers: int, context: int, width: int) -> float:
    """6·N + 12·L·T·d: N the parameters of the model's linear layers (the embeddings are
    lookups, not matmuls)."""
    from torch import nn

    matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    return 6 * matmul + 12 * layers * context * width


def measure(
    device: str, batch: int, steps: int = STEPS, warmup: int = WARMUP, shape: Shape = GPT
) -> dict[str, Any]:
    """The agent's throughput reading after ``steps`` timed steps, and the hand count's."""
    import torch

    from bsmon.probes import attach

    from .models import TokenLoss, gpt, train_step

    torch.manual_seed(0)
    model = gpt(shape.vocab, shape.context, shape.width, shape.layers, shape.heads)
    model = model.to(device, torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss_fn = TokenLoss()
    tokens = torch.randint(0, shape.vocab, (batch, shape.context + 1), device=device)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    with attach(model, optimizer, batch_size=batch, serve=False, record=False) as mon:
        for _ in range(warmup):
            train_step(model, optimizer, loss_fn, x, y)
        sync()
        start = time.perf_counter()
        for _ in range(steps):
            train_step(model, optimizer, loss_fn, x, y)
        sync()
        elapsed = time.perf_counter() - start
        mon.flush()
        reading = mon.stats()["throughput"]
    tokens_per_s = steps * batch * shape.context / elapsed
    per_token = hand_flops_per_token(model, shape.layers, shape.context, shape.width)
    peak = reading.get("peak_flops_per_s")
    return {
        "context": shape.context,
        "agent": reading,
        "tokens_per_s": tokens_per_s,
        "hand_flops_per_token": per_token,
        "hand_mfu": per_token * tokens_per_s / peak if peak else None,
    }


def criteria_of(measured: dict[str, Any]) -> list[Criterion]:
    agent, hand = measured["agent"], measured["hand_mfu"]
    mfu = agent.get("mfu")
    if mfu is None or hand is None:
        why = agent.get("mfu_note") or "no peak"
        return [
            Criterion("the agent's MFU against a hand count", f"n/a: {why}", "within 5%", False)
        ]
    per_example = agent["flops_per_sample"] / measured["context"]
    return [
        Criterion(
            "the agent's MFU against a hand count",
            f"{mfu:.1%} vs {hand:.1%}",
            "within 5%",
            abs(mfu / hand - 1) <= GOAL,
        ),
        Criterion(
            "FLOPs per token: the meta-device count against 6·N + 12·L·T·d",
            f"{per_example / 1e6:.1f} M vs {measured['hand_flops_per_token'] / 1e6:.1f} M",
            "information",
            None,
        ),
        Criterion(
            "tokens/s: the agent's against synchronized blocks",
            f"{agent['tokens_per_s']:,.0f} vs {measured['tokens_per_s']:,.0f}",
            "information",
            None,
        ),
    ]


def run(deadline: Deadline) -> Finding:
    deadline.require(10, "the GPT run")
    measured = measure("cuda", GPU_BATCH)
    criteria = criteria_of(measured)
    agent = measured["agent"]
    table = Table(
        ["device", "dtype", "peak", "agent MFU", "hand-count MFU"],
        [
            [
                str(agent.get("device")),
                str(agent.get("dtype")),
                f"{(agent.get('peak_flops_per_s') or 0) / 1e12:.0f} TFLOP/s",
                f"{agent['mfu']:.1%}" if agent.get("mfu") is not None else "n/a",
                f"{measured['hand_mfu']:.1%}" if measured["hand_mfu"] is not None else "n/a",
            ]
        ],
        title=f"GPT, batch {GPU_BATCH}, {STEPS} steps in bf16",
    )
    ok = criteria[0].ok
    return Finding(
        summary=f"MFU {criteria[0].measured}" + ("" if ok else " (off)"),
        criteria=criteria,
        tables=[table],
        figures={k: v for k, v in measured.items() if k != "agent"} | {"agent": agent},
    )
