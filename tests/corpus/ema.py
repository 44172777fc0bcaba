"""An MLP on a DataLoader whose epochs end in a short batch, with an exponential moving
average of its weights kept in a copy made by copy.deepcopy, and the copy pickled at the
end: the everyday EMA / best-model pattern. ``--task``: the model and its EMA copy are held
by one "task" module that computes the loss (timm's TrainingTask does this), so the module
the script calls holds twice the parameters the optimizer trains."""

from __future__ import annotations

import argparse
import copy
import io
import pickle

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from common import maybe_attach, setup


class Task(nn.Module):
    """The model, its EMA copy, and the loss."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.ema = copy.deepcopy(model)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(self.model(x), y)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", action="store_true")
    args = parser.parse_args()
    setup()
    x = torch.randn(200, 10)
    y = x @ torch.randn(10, 1) + 0.1 * torch.randn(200, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)  # 6 × 32 + 8
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    task = Task(model) if args.task else None
    maybe_attach(task or model, optimizer, name="ema")
    ema = task.ema if task is not None else copy.deepcopy(model)
    for epoch in range(8):
        for xb, yb in loader:
            loss = task(xb, yb) if task is not None else nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                for e, p in zip(ema.parameters(), model.parameters(), strict=True):
                    e.mul_(0.9).add_(p, alpha=0.1)
        best = copy.deepcopy(model)  # a "best model" copy each epoch
        print(f"epoch {epoch}: loss {loss.item():.4f}")
    buffer = io.BytesIO()
    torch.save(ema, buffer)
    restored = pickle.loads(pickle.dumps(best))
    print("ema saved:", buffer.tell() > 0, "best restored:", type(restored).__name__)


if __name__ == "__main__":
    main()
