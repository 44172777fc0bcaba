"""A training script that knows nothing about bsmon. Watch it without changing a line:

    bsmon run -- python examples/unmodified.py
    bsmon run --resizable -- python examples/unmodified.py   # + and - resize its DataLoader

`bsmon run` loads bsmon's agent when the script imports torch; the agent attaches at the first
`optimizer.step()`, finds the model through the optimizer's parameters, counts the samples
the DataLoader yields, and shows the value `backward()` is called on as the loss. Batch-size
control is off unless `--resizable` asks for it: then `+` and `-` change the batch size of the
script's DataLoader at a step boundary, and `p` probes the largest batch (the script's
`nn.CrossEntropyLoss`-style loss is replayed; this one's functional loss is not, and `p` says
why). `q` or Ctrl-C stops the script; `d` detaches and leaves it training.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()

    torch.manual_seed(0)
    images = torch.randn(4096, 1, 16, 16)
    labels = (images.mean(dim=(1, 2, 3)) > 0).long()  # a pattern the CNN can learn
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(images, labels), batch_size=64, shuffle=True
    )
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(8 * 16, 2),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(args.epochs):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        print(f"epoch {epoch}: loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
