"""One rank of a two-process DDP job (gloo, CPU) for the batch-control tests.

Rank 0 asks for a new batch size at step 5; every rank writes (step, batch size, loader batch
length) per step to OUT as JSON.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from bsmon.probes import attach


def main(rank: int, world: int, init_file: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    dataset = torch.utils.data.TensorDataset(torch.randn(4000, 4))
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=False)
    log = []
    with attach(model, optimizer, batch_size=8, name=f"ddp-rank{rank}") as mon:
        loader = mon.dataloader(dataset, sampler=sampler)
        refused = mon.request_batch_size(32).error if rank == 1 else None
        applies_after = None
        for (x,) in loader:
            model(x).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            log.append({"step": mon.step, "batch_size": mon.batch_size, "drawn": len(x)})
            if rank == 0 and mon.step == 5:
                reply = mon.request_batch_size(16, confirm=True)  # before any memory reading
                assert reply.ok, reply.error
                applies_after = reply.result["applies_after_step"]
            if mon.step == 30:
                break
    with open(out, "w") as f:
        result = {"rank": rank, "log": log, "refused": refused, "applies_after": applies_after}
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
