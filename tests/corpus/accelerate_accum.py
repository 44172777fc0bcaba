"""Hugging Face accelerate with gradient accumulation, as its examples train: an
``Accelerator(gradient_accumulation_steps=4)``, ``accelerator.prepare`` of the model, the
optimizer and a DataLoader (which then fetches one batch ahead), ``accelerator.accumulate``
around each micro-batch, and ``accelerator.backward(loss)`` — which divides the loss by 4
before it calls ``backward()``. The prepared optimizer steps once in 4 micro-batches. The
script prints the loss it computed: the first, the mean and the last."""

from __future__ import annotations

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from common import maybe_attach, setup


def main() -> None:
    setup()
    accelerator = Accelerator(gradient_accumulation_steps=4, cpu=True)
    x = torch.randn(2048, 10)
    y = x @ torch.randn(10, 1) + 0.5 * torch.randn(2048, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    maybe_attach(model, optimizer, name="accelerate", batch_size=16)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for _ in range(3):
        for xb, yb in loader:
            with accelerator.accumulate(model):
                loss = nn.functional.mse_loss(model(xb), yb)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            losses.append(loss.item())
    print(f"first loss {losses[0]:.6f}")
    print(f"mean loss {sum(losses) / len(losses):.6f} over {len(losses)} micro-batches")
    print(f"last loss {losses[-1]:.6f}")


if __name__ == "__main__":
    main()
