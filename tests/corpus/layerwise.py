"""One optimizer per layer (greedy layer-wise training): the first layer's SGD steps through
the first epoch, then the second layer's Adam through the second, each after the other has
finished. ``--together``: both step every iteration, one after the other, after one backward
pass. Prints the last iteration's loss in full."""

from __future__ import annotations

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from common import maybe_attach, setup


def main() -> None:
    setup()
    together = "--together" in sys.argv[1:]
    x = torch.randn(3200, 8)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    loader = DataLoader(data, batch_size=16, shuffle=True)  # 200 batches an epoch
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    first = torch.optim.SGD(model[0].parameters(), lr=0.01)
    second = torch.optim.Adam(model[2].parameters(), lr=1e-3)
    maybe_attach(model, first, name="layerwise")
    iteration = 0
    for epoch in range(2):
        for inputs, target in loader:
            loss = (model(inputs) - target).pow(2).mean()
            loss.backward()
            stepping = (first, second) if together else ((first, second)[epoch],)
            for optimizer in stepping:
                optimizer.step()
            model.zero_grad()
            iteration += 1
            if iteration % 100 == 0:
                print(f"iteration {iteration}: loss {loss.item():.4f}")
    print(f"iterations {iteration}, last loss {loss.item()!r}")


if __name__ == "__main__":
    main()
