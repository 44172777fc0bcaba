"""An MLP on a DataLoader whose epochs end in a short batch, with an exponential moving
average of its weights kept in a copy made by copy.deepcopy, and the copy pickled at the
end: the everyday EMA / best-model pattern."""

from __future__ import annotations

import copy
import io
import pickle

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from common import maybe_attach, setup


def main() -> None:
    setup()
    x = torch.randn(200, 10)
    y = x @ torch.randn(10, 1) + 0.1 * torch.randn(200, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)  # 6 × 32 + 8
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    maybe_attach(model, optimizer, name="ema")
    ema = copy.deepcopy(model)
    for epoch in range(8):
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb), yb)
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
