"""A training script that never imports bsmon, for the `bsmon run` tests.

    python zero_code_job.py STEPS EXIT_CODE

Trains STEPS optimizer steps on batches of 8 from a DataLoader, with a validation pass
(batches of 32, no step) after each epoch, prints "trained", waits for a line on stdin, and
exits with EXIT_CODE.
"""

import sys

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def main(steps: int, code: int) -> int:
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    train = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    validation = torch.utils.data.DataLoader(data, batch_size=32)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    done = 0
    while done < steps:
        for x, y in train:
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
            done += 1
            if done == steps:
                break
        with torch.no_grad():
            for x, y in validation:
                nn.functional.mse_loss(model(x), y)
    print("trained", flush=True)
    sys.stdin.readline()
    return code


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
