"""A plain PyTorch training loop with bsmon attached: the most control, three lines of change.

    python examples/plain_loop.py            # then `bsmon` in another terminal
    python examples/plain_loop.py --steps 0  # run until Ctrl-C

A small MLP learns a noisy linear map on generated data, on the GPU if there is one. Press
`+` / `-` in the dashboard: the batch size changes at the next step, and `mon.dataloader`
neither drops nor repeats a sample.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from bsmon.probes import attach


def make_dataset(samples: int = 20_000, features: int = 32) -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(samples, features, generator=generator)
    w = torch.randn(features, 1, generator=generator)
    y = x @ w + 0.5 * torch.randn(samples, 1, generator=generator)
    return torch.utils.data.TensorDataset(x, y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500, help="optimizer steps (0: no end)")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    with attach(model, optimizer, batch_size=args.batch_size, name="plain-loop") as mon:
        loader = mon.dataloader(make_dataset(), shuffle=True)  # follows mon.batch_size
        print(f"plain-loop: training on {device}; `bsmon` in another terminal shows it")
        while mon.step < args.steps or not args.steps:
            for inputs, targets in loader:
                loss = nn.functional.mse_loss(model(inputs.to(device)), targets.to(device))
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                mon.log(loss=loss)
                if args.steps and mon.step >= args.steps:
                    break
        print(f"plain-loop: {mon.step} steps, batch size {mon.batch_size}, loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
