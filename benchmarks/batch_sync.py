"""Cost of the step-boundary batch-size exchange in a DDP job (gloo, CPU, 2 ranks).

Each rank trains a small DDP MLP; blocks of steps alternate between "off" (no exchange) and
"on" (the agent's StepSync exchange at the end of every 8th step, as batch control does), in ABBA
order. Prints the median step time of each and the ratio on/off, from rank 0.

    python benchmarks/batch_sync.py [--rounds 10] [--steps 100]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def rank_main(rank: int, world: int, init: str, rounds: int, steps: int) -> None:
    from bsmon.probes.runtime.distributed import StepSync

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    sync = StepSync(dist.new_group(backend="gloo"), rank)

    def block(with_sync: bool) -> float:
        dist.barrier()
        start = time.perf_counter()
        for step in range(1, steps + 1):
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
            if with_sync and sync.due(step):
                sync.exchange(0)
        elapsed = (time.perf_counter() - start) / steps
        if with_sync:
            sync.exchange(0)  # drain the last broadcast so blocks do not overlap
        return elapsed

    for _ in range(20):
        block(False)  # warm-up (also DDP's bucket rebuild)
    times = {"off": [], "on": []}
    for round_ in range(rounds):
        for variant in ("off", "on") if round_ % 2 == 0 else ("on", "off"):
            times[variant].append(block(variant == "on"))
    if rank == 0:
        off, on = statistics.median(times["off"]), statistics.median(times["on"])
        print(
            f"2 ranks, gloo, {rounds} rounds x {steps} steps per variant, "
            f"an exchange every {sync.every} steps"
        )
        print(
            f"off: {off * 1e3:.3f} ms/step   on: {on * 1e3:.3f} ms/step   "
            f"exchange ≈ {(on - off) * 1e6:.0f} µs/step"
        )
        print(f"step-sync ratio on/off: {on / off:.4f}")
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "init")
        mp.spawn(rank_main, args=(2, init, args.rounds, args.steps), nprocs=2, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
