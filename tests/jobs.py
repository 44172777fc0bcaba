"""Small real training jobs for tests: a model, an optimizer, and a step function."""

from __future__ import annotations

import torch
from torch import nn


class TinyJob:
    def __init__(self, batch_size: int = 8, features: int = 4, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.model = nn.Linear(features, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.batch_size = batch_size
        self.features = features

    def step(self, mon: object | None = None) -> torch.Tensor:
        x = torch.randn(self.batch_size, self.features)
        loss = self.model(x).pow(2).mean()
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        if mon is not None:
            mon.log(loss=loss)  # type: ignore[attr-defined]
        return loss
