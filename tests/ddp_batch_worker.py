"""One rank of a two-process DDP job (gloo, CPU) for the batch-control tests.

Rank 0 asks for a new batch size at step 5; every rank writes (step, batch size, loader batch
length) per step to OUT as JSON. With ``fsdp2`` as a fifth argument, the model is sharded with
``fully_shard`` instead of wrapped in DDP. With ``autopilot`` as a fifth argument, the
autopilot steers instead (switched on at every rank: rank 0's decides), on ten noisy classes
until a change it asked for has been applied and 20 steps more, and every rank writes its
learning rate too.
"""

from __future__ import annotations

import itertools
import json
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

from bsmon.probes import attach


def main(rank: int, world: int, init_file: str, out: str, wrap: str = "ddp") -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 1)) if wrap == "ddp" else fully_shard(nn.Linear(4, 1))
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


def autopilot(rank: int, world: int, init_file: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(20_000, 20, generator=generator)
    weights = torch.randn(20, 10, generator=generator)
    y = (x @ weights + 2 * torch.randn(20_000, 10, generator=generator)).argmax(1)
    dataset = torch.utils.data.TensorDataset(x, y)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    sampler = torch.utils.data.distributed.DistributedSampler(dataset)
    log: list[dict] = []
    with attach(
        model, optimizer, batch_size=8, max_batch_size=32, autopilot=True, name=f"ap{rank}"
    ) as mon:
        loader = mon.dataloader(dataset, sampler=sampler)
        changed_at: int | None = None

        def done() -> bool:
            return mon.step > 20_000 or (changed_at is not None and mon.step >= changed_at + 20)

        for epoch in itertools.count():
            sampler.set_epoch(epoch)
            for inputs, labels in loader:
                loss = nn.functional.cross_entropy(model(inputs), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                mon.log(loss=loss)
                lr = optimizer.param_groups[0]["lr"]
                log.append({"step": mon.step, "batch_size": mon.batch_size, "lr": lr})
                if changed_at is None and mon.batch_size != 8:
                    changed_at = mon.step
                if done():
                    break
            if done():
                break
        reading = mon.job.autopilot_reading()
        decisions = [d.new for d in reading.decisions] if reading is not None else None
    with open(out, "w") as f:
        json.dump({"rank": rank, "log": log, "decisions": decisions}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    rank, world, init, out, *mode = sys.argv[1:]
    if mode == ["autopilot"]:
        autopilot(int(rank), int(world), init, out)
    else:
        main(int(rank), int(world), init, out, *mode)
