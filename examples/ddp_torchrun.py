"""A DistributedDataParallel script for torchrun, unchanged for bsmon:

    bsmon run -- torchrun --standalone --nproc-per-node 2 examples/ddp_torchrun.py

Every rank gets bsmon's agent and serves its own socket: rank 0 under the job's name (the
dashboard opens on it), the others as NAME-rank1, ... (`bsmon list`, `bsmon attach`). It
runs on gloo and the CPU here, on NCCL with one GPU per rank where there are GPUs.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps (0: no end)")
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    dataset = TensorDataset(torch.randn(8192, 32), torch.randn(8192, 1))
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 1)).to(device)
    model = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    step, epoch = 0, 0
    while step < args.steps or not args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if step == args.steps:
                break
        epoch += 1
    if rank == 0:
        print(f"ddp: {step} steps on {dist.get_world_size()} ranks, loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
