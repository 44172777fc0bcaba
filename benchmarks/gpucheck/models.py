"""The probe check's models on generated data — a ResNet-style CNN and a GPT-style
transformer — and the one training step that the job and every brute-force trial run.

Both models are ``nn.Sequential``, so the probe measures activation checkpointing on them.
Classes live here (not in ``__main__``) so that the probe's sidecar imports them by name.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from bsmon.probes.demo import TokenLoss, TransformerBlock  # the demo's sequence model's


class BasicBlock(nn.Module):
    def __init__(self, inputs: int, outputs: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.shortcut = nn.Sequential()
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(
                nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


def resnet(classes: int = 100, widths: tuple[int, ...] = (64, 128, 256, 512)) -> nn.Sequential:
    """ResNet-18's layout on 3x64x64 images (a stride-2 stem, two blocks per stage)."""
    layers: list[nn.Module] = [
        nn.Conv2d(3, widths[0], 3, 2, 1, bias=False),
        nn.BatchNorm2d(widths[0]),
        nn.ReLU(),
    ]
    inputs = widths[0]
    for stage, width in enumerate(widths):
        layers += [BasicBlock(inputs, width, 1 if stage == 0 else 2), BasicBlock(width, width, 1)]
        inputs = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(inputs, classes)]
    return nn.Sequential(*layers)


class Embeddings(nn.Module):
    def __init__(self, vocab: int, context: int, width: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.tokens(tokens) + self.positions(positions)


def gpt(
    vocab: int = 8192, context: int = 256, width: int = 384, layers: int = 6, heads: int = 6
) -> nn.Sequential:
    return nn.Sequential(
        Embeddings(vocab, context, width),
        *(TransformerBlock(width, heads) for _ in range(layers)),
        nn.LayerNorm(width),
        nn.Linear(width, vocab),
    )


Inputs = Callable[[int, torch.device | str], tuple[torch.Tensor, torch.Tensor]]


def images(size: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(size, 3, 64, 64, device=device), torch.randint(
        0, 100, (size,), device=device
    )


def token_ids(size: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, 8192, (size, 257), device=device)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


@dataclass(frozen=True)
class Spec:
    label: str
    build: Callable[[], nn.Module]
    loss: Callable[[], nn.Module]
    inputs: Inputs
    job_batch: int


SPECS = {
    "resnet": Spec(
        "ResNet-18-style CNN, 3x64x64 images, 100 classes",
        resnet,
        nn.CrossEntropyLoss,
        images,
        64,
    ),
    "gpt": Spec(
        "GPT-style transformer (6 layers, width 384, 256 tokens, vocabulary 8192)",
        gpt,
        TokenLoss,
        token_ids,
        8,
    ),
}


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    bf16: bool = False,
    checkpoint: bool = False,
) -> torch.Tensor:
    """One step, optionally in bf16 autocast or with activation checkpointing (split into
    sqrt(len(model)) segments, as the probe's sidecar does)."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
        if checkpoint:
            from torch.utils.checkpoint import checkpoint_sequential

            segments = max(1, int(math.sqrt(len(model))))  # type: ignore[arg-type]
            out = checkpoint_sequential(model, segments, x, use_reentrant=False)
        else:
            out = model(x)
        loss = loss_fn(out, y)
    loss.backward()
    optimizer.step()
    return loss
