"""No torch.optim optimizer: the parameters are updated by hand."""

from __future__ import annotations

import torch

from common import setup


def main() -> None:
    setup()
    w = torch.zeros(4, requires_grad=True)
    truth = torch.tensor([1.0, -2.0, 0.5, 3.0])
    for step in range(30):
        x = torch.randn(16, 4)
        loss = (x @ w - x @ truth).pow(2).mean()
        loss.backward()
        with torch.no_grad():
            w -= 0.05 * w.grad
            w.grad.zero_()
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
