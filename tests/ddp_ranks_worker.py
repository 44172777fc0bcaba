"""One rank of a DDP job (gloo, CPU) that trains until killed, for the ranks-view tests.

    python tests/ddp_ranks_worker.py RANK WORLD INIT_FILE [--slow RANK]

The rank given by --slow sleeps 30 ms in every forward pass: a straggler.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from bsmon.probes import attach


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("rank", type=int)
    parser.add_argument("world", type=int)
    parser.add_argument("init")
    parser.add_argument("--slow", type=int, default=-1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{args.init}", rank=args.rank, world_size=args.world
    )
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    if args.rank == args.slow:
        net[0].register_forward_pre_hook(lambda *_: time.sleep(0.03))
    model = DDP(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(100_000, 32), torch.randint(0, 4, (100_000,)))
    sampler = torch.utils.data.DistributedSampler(data)
    loss_fn = nn.CrossEntropyLoss()
    with attach(model, optimizer, batch_size=16, name="ranks", loss_fn=loss_fn) as mon:
        for x, y in mon.dataloader(data, sampler=sampler):
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()


if __name__ == "__main__":
    main()
