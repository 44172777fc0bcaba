"""``hostcost.py --sharded``: starts sharded.py's ranks under torchrun, one job per wrap, and
prints what they measured beside the unsharded goals."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from .goals import print_goals, spread
from .timing import Block

BENCHMARKS = Path(__file__).resolve().parents[1]
WORLD = 2


def run_ranks(wrap: str, extra: list[str]) -> list[dict]:
    """Each rank's results of one torchrun job of ``wrap``, rank 0 first."""
    with tempfile.TemporaryDirectory(prefix="bsm-", dir="/tmp") as where:
        os.chmod(where, 0o700)
        path = os.pathsep.join((str(BENCHMARKS), str(BENCHMARKS.parent)))
        env = {**os.environ, "BSMON_DIR": where, "PYTHONPATH": path}
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        command += ["--nproc-per-node", str(WORLD), "-m", "hostcost_kit.sharded"]
        command += ["--wrap", wrap, "--out", where, *extra]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.exit(f"the {wrap} ranks failed:\n{done.stderr[-3000:]}")
        return [json.loads(Path(where, f"rank{r}.json").read_text()) for r in range(WORLD)]


def print_counts(ranks: list[dict]) -> None:
    print(f"{'configuration':46} {'ordinary':>8} {'mean':>7} {'bsmon':>6}  by category")
    for name, count in ranks[0]["counts"].items():
        parts = ", ".join(f"{k} {v:+d}" for k, v in count["by_category"].items())
        others = [r["counts"][name]["ordinary"] for r in ranks[1:]]
        differs = f"  (rank 1..: {others})" if any(o != count["ordinary"] for o in others) else ""
        print(
            f"{name:46} {count['ordinary']:>+8d} {count['mean']:>+7.1f} "
            f"{count['bsmon']:>+6d}  {parts}{differs}"
        )


def print_times(ranks: list[dict]) -> None:
    """Rank 0's blocks (the step is the slower rank's: a collective in it waits), each rank's
    agent threads; then the goals' verdicts on rank 0's rounds."""
    bare_us = ranks[0]["bare_step_s"] * 1e6
    print(f"bare step {bare_us:.0f} µs (rank 0's median); µs added per step, median [IQR]")
    print("over rounds; % of the bare step; agent threads' CPU per step on each rank\n")
    agents = " ".join(f"{f'rank {r}':>7}" for r in range(len(ranks)))
    print(f"{'configuration':46} {'ordinary step':>21} {'every step':>21} {'%':>5} {agents}")
    ordinary_us: dict[str, list[float]] = {}
    every_us: dict[str, list[float]] = {}
    for name, rows in ranks[0]["blocks"].items():
        blocks = [Block(*row) for row in rows]
        ordinary_us[name] = [(b.ordinary + b.others) * 1e6 for b in blocks]
        every_us[name] = [(b.wall + b.others) * 1e6 for b in blocks]
        share = 100 * statistics.median(every_us[name]) / bare_us
        threads = " ".join(
            f"{statistics.median(Block(*row).others * 1e6 for row in r['blocks'][name]):7.1f}"
            for r in ranks
        )
        print(
            f"{name:46} {spread(ordinary_us[name]):>21} {spread(every_us[name]):>21} "
            f"{share:+5.1f} {threads}"
        )
    print_goals({"ordinary step": ordinary_us, "every step": every_us})


def main(wraps: list[str], counts_only: bool, rounds: int, steps: int) -> None:
    extra = ["--rounds", str(rounds), "--steps", str(steps)]
    if counts_only:
        extra.append("--counts-only")
    for wrap in wraps:
        ranks = run_ranks(wrap, extra)
        print(f"\n{wrap}, {WORLD} gloo ranks (torchrun): Python calls added per step on rank 0's")
        print("training thread (sharded_job.py's transformer, batch 16 × 16 tokens a rank)\n")
        print_counts(ranks)
        if not counts_only:
            print(f"\n{wrap}: {rounds} rounds × {steps} steps, interleaved as above")
            print_times(ranks)
