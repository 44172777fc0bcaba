"""Reinforcement learning as pytorch/examples writes it (reinforce.py, actor_critic.py): one
forward per environment step on one state, one backward and optimizer step per episode, and
episodes as long as they last, never the same two in a row. The state is a ``[1, 4]``
(reinforce.py's ``unsqueeze(0)``); ``--unbatched``: a ``[4]`` (actor_critic.py); ``--flat``:
eight scalar states as a ``[8]`` that the model unsqueezes itself (which bsmon cannot tell
from one example's features). Prints each episode's forward passes: its examples."""

from __future__ import annotations

import sys

import torch
from torch import nn

from common import maybe_attach, setup

EPISODES = 60


class Policy(nn.Module):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.affine = nn.Linear(features, 16)
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 1 and self.affine.in_features == 1:
            x = x.unsqueeze(-1)  # --flat: a batch of scalars
        return self.head(torch.relu(self.affine(x)))


def state(mode: str) -> torch.Tensor:
    if mode == "--unbatched":
        return torch.randn(4)
    if mode == "--flat":
        return torch.randn(8)
    return torch.randn(1, 4)


def main() -> None:
    setup()
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    model = Policy(1 if mode == "--flat" else 4)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    maybe_attach(model, optimizer, name="episodes")
    examples = []
    for episode in range(EPISODES):
        length = 5 + (episode * 7) % 23  # 5..27 forward passes
        outputs = [model(state(mode)).sum() for _ in range(length)]
        optimizer.zero_grad()
        torch.stack(outputs).sum().backward()
        optimizer.step()
        examples.append(length * (8 if mode == "--flat" else 1))
    print("examples per episode", " ".join(map(str, examples)))


if __name__ == "__main__":
    main()
