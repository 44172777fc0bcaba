"""Data parallelism behind a framework's wrapper: ranks started by torchrun (gloo, CPU), each
holding its DistributedDataParallel model as an attribute of a module of the framework's own —
as Lightning Fabric's ``_FabricModule`` and timm's ``TrainingTask`` do — and the script calls
the wrapper, never the DDP model. ``--alone``: every rank trains a model of its own, not DDP
(a distributed run whose ranks never average gradients). ``--until FILE``: once trained, wait
(at most a minute) for FILE to exist before exiting, so a test can look at the live job.

    python -m torch.distributed.run --standalone --nproc-per-node 2 ddp_wrapped.py
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from common import maybe_attach, setup


class Wrapper(nn.Module):
    """What a framework hands back from its setup: the module the script calls, holding the
    parallel module it forwards to and the user's original."""

    def __init__(self, original: nn.Module, parallel: nn.Module) -> None:
        super().__init__()
        self.forward_module = parallel
        self.original_module = original

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_module(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--alone", action="store_true")
    parser.add_argument("--until", default=None)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    setup()
    x = torch.randn(8192, 16)
    y = x @ torch.randn(16, 1) + 0.5 * torch.randn(8192, 1)
    data = TensorDataset(x, y)
    loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data, seed=0))
    net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    model = Wrapper(net, net if args.alone else DistributedDataParallel(net))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.002)
    maybe_attach(model, optimizer, name="wrapped", batch_size=32)
    step = 0
    while step < args.steps:
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if rank == 0 and step % 50 == 0:
                print(f"step {step}: loss {loss.item():.4f}", flush=True)
            if step == args.steps:
                break
    if args.until:
        deadline = time.monotonic() + 60
        while not os.path.exists(args.until) and time.monotonic() < deadline:
            time.sleep(0.1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
