"""Two models and two optimizers stepping in turn (a GAN): the generator's backward pass runs
through the discriminator. Exits with code 3."""

from __future__ import annotations

import sys

import torch
from torch import nn

from common import maybe_attach, setup


def main() -> None:
    setup()
    netD = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    netG = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    optD = torch.optim.Adam(netD.parameters(), lr=2e-3)
    optG = torch.optim.Adam(netG.parameters(), lr=2e-3)
    maybe_attach(netD, optD, name="gan")
    criterion = nn.BCEWithLogitsLoss()
    for step in range(60):
        real = torch.randn(32, 2) * 0.3 + torch.tensor([1.0, -1.0])
        fake = netG(torch.randn(32, 4))
        netD.zero_grad()
        errD = criterion(netD(real), torch.ones(32, 1)) + criterion(
            netD(fake.detach()), torch.zeros(32, 1)
        )
        errD.backward()
        optD.step()
        netG.zero_grad()
        errG = criterion(netD(fake), torch.ones(32, 1))
        errG.backward()
        optG.step()
        if step % 10 == 0:
            print(f"step {step}: D {errD.item():.4f} G {errG.item():.4f}")
    sys.exit(3)


if __name__ == "__main__":
    main()
