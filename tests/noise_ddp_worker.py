"""One rank of a 2-process gloo DDP linear regression with bsmon attached (run as a script).

Prints one JSON line: this rank's noise reading, the estimator's capability, and how often a
user's comm hook ran. ``--user-hook after`` registers a counting all-reduce hook after
attach() (bsmon wraps it); ``before`` registers it before attach() (bsmon cannot wrap it and
falls back to per-example norms).
"""

from __future__ import annotations

import argparse
import copy
import json
import pickle
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bsmon.probes import attach
from bsmon.probes.noise import ddp as ddp_source
from workloads.noise_jobs import ANISO, ISO_BIAS, Regression, train

CASES = {"iso+bias": ISO_BIAS, "aniso": ANISO}
calls = {"user_hook": 0}


def counting_hook(state, bucket):
    calls["user_hook"] += 1
    return default_hooks.allreduce_hook(state, bucket)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--init", required=True)
    parser.add_argument("--case", default="iso+bias")
    parser.add_argument("--reduction", default="mean")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=128, help="per rank")
    parser.add_argument("--user-hook", choices=("none", "before", "after"), default="none")
    parser.add_argument(
        "--micro", type=int, default=1, help="micro-batches, all but the last under no_sync"
    )
    parser.add_argument(
        "--sync-each-micro",
        action="store_true",
        help="no no_sync: every micro-batch's backward pass all-reduces",
    )
    parser.add_argument(
        "--defaults", action="store_true", help="bsmon's default cost budget and window"
    )
    parser.add_argument(
        "--no-copy", action="store_true", help="as if the device had no room for a local copy"
    )
    args = parser.parse_args()
    if args.no_copy:
        ddp_source.COPY_ROOM = 0.0
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=args.init, rank=args.rank, world_size=2)
    case = CASES[args.case]
    job = Regression(case, seed=100 + args.rank)  # each rank its own data
    ddp = DistributedDataParallel(job.model)
    if args.user_hook == "before":
        ddp.register_comm_hook(dist.group.WORLD, counting_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.0)
    original_register = DistributedDataParallel.register_comm_hook
    with attach(
        ddp,
        optimizer,
        batch_size=args.batch,
        serve=False,
        name=f"ddp-rank{args.rank}",
        **({} if args.defaults else {"noise_budget": None, "noise_window": args.steps}),
    ) as mon:
        if args.user_hook == "after":
            ddp.register_comm_hook(dist.group.WORLD, counting_hook)
        train(
            job,
            optimizer,
            steps=args.steps,
            batch=args.batch,
            micro=args.micro,
            reduction=args.reduction,
            ddp=ddp,
            no_sync=not args.sync_each_micro,
        )
        assert mon.flush()
        stats = mon.stats()
        capability = mon._noise.capability
        # the DDP model copies and pickles as without bsmon (a user's hook registered before
        # attach, with the process group as its state, would stop any copy)
        pickled = None if args.user_hook == "before" else pickle.dumps(copy.deepcopy(ddp))
    print(
        json.dumps(
            {
                "rank": args.rank,
                "noise": stats["noise"],
                "errors": stats["errors"],
                "capability": [capability.available, capability.reason],
                "user_hook_calls": calls["user_hook"],
                "truth": case.truth(),
                "pickle_clean": pickled is not None and b"bsmon" not in pickled,
                "class_restored": DistributedDataParallel.register_comm_hook is original_register,
            }
        ),
        flush=True,
    )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
