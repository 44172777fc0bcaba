"""Cost of gathering every rank's summary on rank 0, per training step (gloo, CPU, 4 ranks).

Blocks of DDP training steps alternate (ABBA) between the agent attached with the ranks view
(each rank's agent sends a summary to rank 0 every 2 s; rank 0 receives them on its own
threads) and attached without it. Prints the median step time of each and the ratio
(goal: <= 1.005).

    python benchmarks/ranks_gather.py [--world 4] [--rounds 8] [--steps 600]
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


def rank_main(rank: int, world: int, init: str, rounds: int, steps: int, out: str) -> None:
    from bsmon.probes import attach

    torch.set_num_threads(1)
    os.environ["BSMON_DIR"] = out
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 128), torch.randint(0, 10, (32,))

    def block(view: bool) -> float:
        mon = attach(model, optimizer, batch_size=32, name="gather-bench", ranks_view=view)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):  # the same count on every rank: DDP steps in lockstep
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
        elapsed = (time.perf_counter() - start) / steps
        mon.close()
        return elapsed

    block(False)  # warm-up
    times: dict[str, list[float]] = {"off": [], "on": []}
    for round_ in range(rounds):
        for variant in ("off", "on") if round_ % 2 == 0 else ("on", "off"):
            times[variant].append(block(variant == "on"))
    if rank == 0:
        off, on = statistics.median(times["off"]), statistics.median(times["on"])
        print(f"{world} ranks, gloo, {rounds} rounds of {steps} steps per variant")
        print(f"without the ranks view: {off * 1e3:.3f} ms/step   with it: {on * 1e3:.3f} ms/step")
        print(f"gathering ratio on/off: {on / off:.4f}  (goal <= 1.005)")
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument(
        "--steps",
        type=int,
        default=600,
        help="steps per block (several gathers, which happen every 2 s)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        mp.spawn(
            rank_main,
            args=(args.world, os.path.join(tmp, "init"), args.rounds, args.steps, tmp),
            nprocs=args.world,
            join=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
