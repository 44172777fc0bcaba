"""Hugging Face accelerate with FSDP2 on two CPU ranks (gloo), launched by torchrun: an
``Accelerator`` given a ``FullyShardedDataParallelPlugin(fsdp_version=2)``, ``prepare`` of the
model, the optimizer and a DataLoader (sharded across the ranks), ``accelerator.backward``.
Rank 0 prints the first and last loss of each epoch."""

from __future__ import annotations

import argparse

import torch
from accelerate import Accelerator
from accelerate.utils import FullyShardedDataParallelPlugin
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from common import setup


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    setup()
    accelerator = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
    x = torch.randn(640, 10)
    y = x @ torch.randn(10, 1) + 0.5 * torch.randn(640, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=16)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(args.epochs):
        losses = []
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        accelerator.print(f"epoch {epoch}: first loss {losses[0]:.6f}, last {losses[-1]:.6f}")
    accelerator.print(f"distributed type {accelerator.distributed_type}")


if __name__ == "__main__":
    main()
