"""A variational autoencoder whose loss adds up its examples, as pytorch/examples' vae/main.py
does: a binary cross-entropy with reduction='sum' plus a KL term summed with torch.sum. The
script prints the loss per example (the sum over the batch divided by its size)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from common import maybe_attach, setup


class VAE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encode = nn.Linear(64, 32)
        self.mu, self.logvar = nn.Linear(32, 8), nn.Linear(32, 8)
        self.decode = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 64))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = F.relu(self.encode(x))
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return torch.sigmoid(self.decode(z)), mu, logvar


def loss_function(recon, x, mu, logvar) -> torch.Tensor:
    bce = F.binary_cross_entropy(recon, x, reduction="sum")
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return bce + kld


def main() -> None:
    setup()
    data = (torch.rand(1024, 64) > 0.5).float()
    loader = DataLoader(TensorDataset(data), batch_size=32, shuffle=True)
    model = VAE()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    mon = maybe_attach(model, optimizer, name="vae", batch_size=32)
    for epoch in range(2):
        for step, (x,) in enumerate(loader):
            recon, mu, logvar = model(x)
            loss = loss_function(recon, x, mu, logvar)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if mon is not None:
                mon.log(loss=loss)
            if step % 10 == 0:
                print(f"epoch {epoch} step {step}: loss {loss.item() / len(x):.4f} per example")


if __name__ == "__main__":
    main()
