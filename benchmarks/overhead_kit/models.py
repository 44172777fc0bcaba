"""The models of benchmarks/overhead.py (an MLP, a CNN and a transformer block) and one
training step of each, on any device (the GPU check's jobs take the same steps)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

Step = Callable[[object | None], torch.Tensor | None]


def mlp(batch: int) -> tuple[nn.Module, tuple[torch.Tensor, ...], nn.Module, int]:
    model = nn.Sequential(
        nn.Linear(256, 640), nn.ReLU(), nn.Linear(640, 640), nn.ReLU(), nn.Linear(640, 10)
    )
    return model, (torch.randn(batch, 256),), nn.CrossEntropyLoss(), batch


def cnn(batch: int) -> tuple[nn.Module, tuple[torch.Tensor, ...], nn.Module, int]:
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1, stride=2),
        nn.GroupNorm(8, 64),
        nn.ReLU(),
        nn.Conv2d(64, 128, 3, padding=1, stride=2),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, 10),
    )
    return model, (torch.randn(batch, 3, 32, 32),), nn.CrossEntropyLoss(), batch


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 1000, width: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.block = nn.TransformerEncoderLayer(
            width, nhead=4, dim_feedforward=4 * width, dropout=0.0, batch_first=True
        )
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.embed(tokens))).flatten(0, 1)


def transformer(batch: int) -> tuple[nn.Module, tuple[torch.Tensor, ...], nn.Module, int]:
    model = TinyTransformer()
    tokens = torch.randint(0, 1000, (batch, 64))
    return model, (tokens,), nn.CrossEntropyLoss(), batch


MODELS = {
    "mlp": (mlp, 256, "MLP 256-640-640-10, batch {batch}"),
    "cnn": (cnn, 64, "CNN 3 conv + GroupNorm on 3x32x32, batch {batch}"),
    "transformer": (
        transformer,
        16,
        "Embedding + TransformerEncoderLayer(128, 4 heads) + head, batch {batch} x 64 tokens",
    ),
}


def make_step(
    name: str, device: torch.device | str = "cpu", batch: int | None = None
) -> tuple[nn.Module, torch.optim.Optimizer, Step, int, str]:
    """A model, its optimizer and one training step on ``device`` (the default batch unless
    ``batch`` is given); returns (model, optimizer, step, examples per step, label)."""
    build, default_batch, label = MODELS[name]
    batch = batch or default_batch
    torch.manual_seed(0)
    model, inputs, loss_fn, examples = build(batch)
    model = model.to(device)
    inputs = tuple(t.to(device) for t in inputs)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with torch.no_grad():
        out = model(*inputs)
    target = torch.randint(0, out.shape[-1], (out.shape[0],), device=device)

    def step(mon: object | None = None) -> torch.Tensor:
        loss = loss_fn(model(*inputs), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if mon is not None:
            mon.log(loss=loss)  # type: ignore[attr-defined]
        return loss

    return model, optimizer, step, examples, label.format(batch=batch)
