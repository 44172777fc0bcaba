"""LBFGS stepped with a closure, as in PyTorch's time_sequence_prediction example: each
optimizer.step(closure) evaluates the model several times."""

from __future__ import annotations

import torch
from torch import nn

from common import maybe_attach, setup


def main() -> None:
    setup()
    t = torch.linspace(0, 6, 64).unsqueeze(1)
    target = torch.sin(t)
    model = nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)
    maybe_attach(model, optimizer, name="lbfgs")
    for step in range(12):

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = (model(t) - target).pow(2).mean()
            loss.backward()
            return loss

        loss = optimizer.step(closure)
        print(f"step {step}: loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
