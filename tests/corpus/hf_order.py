"""Asks importlib whether torch is installed before importing it, as transformers, datasets
and accelerate do, then trains."""

from __future__ import annotations

import importlib.util

assert importlib.util.find_spec("torch") is not None

import torch  # noqa: E402
from torch import nn  # noqa: E402

from common import maybe_attach, setup  # noqa: E402


def main() -> None:
    setup()
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    maybe_attach(model, optimizer, name="hf_order")
    for step in range(60):
        x = torch.randn(16, 8)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
