"""torch.compile: under bsmon run the script compiles and bsmon attaches at the first step;
with CORPUS_ATTACH the script attaches first and compiles after."""

from __future__ import annotations

import torch
from torch import nn

from common import maybe_attach, setup


def main() -> None:
    setup()
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    maybe_attach(model, optimizer, name="compiled")
    compiled = torch.compile(model)
    for step in range(40):
        x = torch.randn(16, 8)
        loss = (compiled(x) - x[:, :1]).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item():.4f}")
    counters = torch._dynamo.utils.counters
    print("graphs compiled:", counters["stats"]["unique_graphs"])


if __name__ == "__main__":
    main()
