"""B_simple under FSDP2 against DDP: the same small transformer, the same data, the same seed.

``workloads/sharded_job.py`` trains under torchrun (gloo, CPU) once with DistributedDataParallel
(bsmon's ``ddp`` estimator: each rank's gradient against the all-reduced one) and once sharded
with ``fully_shard`` (the ``sharded`` estimator: per-example norms on every rank, |ḡ|² summed
over the ranks' shards). Both runs see the same examples and train the same weights up to
rounding, so their true B_simple is the same; the table prints rank 0's estimate of each
with its reported standard error, their difference in percent and in standard errors of the
difference (goal: within 10%).

The noise scale is measured on every step (``BSMON_NOISE_BUDGET=all``) unless ``--budget``
says otherwise (``default``: bsmon's cost budget, each rank its own): the comparison is of the
estimators, not of how many steps the cost budget lets each measure.

    python benchmarks/sharded_noise.py [--world 2 4] [--seeds 3] [--steps 400] [--budget all]
        [--lr 0.001]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "workloads" / "sharded_job.py"


def run(wrap: str, world: int, seed: int, steps: int, budget: str, lr: float) -> dict:
    """Rank 0's result of one torchrun job."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(world),
        str(JOB),
        "--wrap",
        wrap,
        "--attach",
        "--seed",
        str(seed),
        "--steps",
        str(steps),
        "--lr",
        str(lr),
    ]
    with tempfile.TemporaryDirectory(prefix="bsm-", dir="/tmp") as directory:
        os.chmod(directory, 0o700)
        env = {**os.environ, "BSMON_DIR": directory, "BSMON_NOISE_BUDGET": budget}
        if budget == "default":
            del env["BSMON_NOISE_BUDGET"]
        command += ["--results", directory]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{wrap} x{world} seed {seed} failed:\n{done.stderr[-3000:]}")
        return json.loads((Path(directory) / "rank0.json").read_text())["noise"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world", type=int, nargs="+", default=[2])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument(
        "--budget", default="all", help="BSMON_NOISE_BUDGET for both runs ('default': unset)"
    )
    parser.add_argument("--lr", type=float, default=1e-3, help="0: B_simple stays put")
    args = parser.parse_args()
    print(
        f"{args.steps} steps, 16 examples of 16 tokens per rank, budget {args.budget}, "
        f"learning rate {args.lr:g}"
    )
    print("ranks seed   DDP B_simple ± se     FSDP2 B_simple ± se   FSDP2-DDP   in se  measured")
    for world in args.world:
        for seed in range(args.seeds):
            ddp = run("ddp", world, seed, args.steps, args.budget, args.lr)
            fsdp = run("fsdp2", world, seed, args.steps, args.budget, args.lr)
            b_d, s_d, b_f, s_f = ddp["b_simple"], ddp["stderr"], fsdp["b_simple"], fsdp["stderr"]
            if None in (b_d, s_d, b_f, s_f):
                print(f"{world:5} {seed:4}   no estimate: ddp {ddp['note']} / fsdp2 {fsdp['note']}")
                continue
            gap = b_f - b_d
            print(
                f"{world:5} {seed:4}   {b_d:8.3f} ± {s_d:6.3f}     {b_f:8.3f} ± {s_f:6.3f}     "
                f"{gap / b_d:+7.1%}  {gap / math.hypot(s_d, s_f):+6.2f}  "
                f"{ddp['samples']}/{fsdp['samples']}"
            )
            if "left out" in (fsdp["detail"] or ""):  # steps not every rank measured
                print(f"             FSDP2: {fsdp['detail']}")


if __name__ == "__main__":
    main()
