"""What bsmon costs the training thread per step: Python calls (counted, deterministic) and
microseconds (timed side by side), on steps small enough to be all fixed host overhead.

On a GPU a small or medium model's step is host-bound, so every Python call bsmon makes on
the training thread is added to the step. The same cost shows on a CPU with a step that is
mostly PyTorch's own fixed overhead: ``tiny`` is ``nn.Linear(16, 16)`` at batch 4 (~160 µs
here), ``mid`` an MLP 256-512-512-10 at batch 16 (~0.9 ms).

Counts: cProfile on the training thread only (CPython's profiler is per thread), one profile
per step, every category — bsmon's own functions and the builtins, torch and stdlib calls
they cause — minus the same loop without bsmon. An *ordinary* step is the most common count
(a step the noise scale does not measure and the anatomy does not sample); the mean includes
the measured and sampled ones.

Times: rounds of blocks, one block per configuration in an order rotated every round, all on
one model (a fresh model per block moves the step by more than these costs), each block a
fresh attach, untimed warm-up steps, then timed steps, each step timed on its own. A bare
block is timed before a round's first configuration and after each one, and a block counts
as itself less the mean of its two bare neighbours: this machine's step drifts by ±10 µs
over seconds, far more than the costs measured, and a drift linear over the three cancels.
Two measures a block: the *ordinary step* (its median step: what every step pays; its
rounds spread by ~1 µs here, IQR) and *every step* (its mean, each step counted at most ``CLIP``
times the median: the sampled and measured steps count, a step this machine stretched by
milliseconds does not swamp the block; its rounds spread by 3–8 µs). Both add the CPU time
of the threads the configuration started, per step: bsmon's agent thread shares the GIL
with the training thread, so its work lands on the step (counted in full: an upper bound,
since the part spent in C with the GIL let go overlaps the step). bare's own row, bare less
bare, is the method's noise. A goal's verdict (issue 22: telemetry ≤ 2×, + record ≤ 3× a
floor) comes from a bootstrap interval of the ratio of medians over rounds: met or not met
when the whole interval says so, else not told apart on this machine. Two floors: issue 22's
(a post-hook with a clock and an append), and the same with the loop's logging line keeping
the loss (``latest.update(loss=loss)``), since every other row logs the loss and the log line
alone costs more in situ than the post-hook does.
Printed, never asserted: the counts are pinned in ``tests/unit/test_hot_path.py``.

    python benchmarks/hostcost.py                      # counts and times, tiny model
    python benchmarks/hostcost.py --model mid --rounds 15
    python benchmarks/hostcost.py --only floor telemetry "+ record" --rounds 40  # the goals
    python benchmarks/hostcost.py --counts-only
    python benchmarks/hostcost.py --sharded --rounds 9 --steps 300  # FSDP2, DDP: 2 gloo ranks

``--sharded``: the same counts and times on each rank of a 2-rank gloo job under torchrun,
workloads/sharded_job.py's small transformer sharded with FSDP2 and, for comparison, the same
model under DDP (hostcost_kit/sharded.py); the step there is milliseconds, not microseconds,
so the goals' ratios are wide: the counts are what compares exactly.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
from hostcost_kit import sharded_run
from hostcost_kit.counting import count_calls
from hostcost_kit.goals import print_goals, spread
from hostcost_kit.setups import CONFIGS, MODELS, SHARDED, WARMUP, available
from hostcost_kit.timing import CLIP, time_configs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=MODELS, default="tiny")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=2000, help="timed steps per block")
    parser.add_argument("--counts-only", action="store_true")
    parser.add_argument(
        "--only", nargs="+", metavar="WORD", help="the configurations whose names have a WORD"
    )
    parser.add_argument(
        "--sharded", nargs="*", choices=SHARDED, help="the 2-rank jobs (default: both wraps)"
    )
    args = parser.parse_args()
    if args.sharded is not None:
        sharded_run.main(args.sharded or list(SHARDED), args.counts_only, args.rounds, args.steps)
        return
    torch.set_num_threads(1)
    names = [name for name in CONFIGS if (why := available(name)) is None or print(why)]
    if args.only:
        names = [n for n in names if n == "bare" or any(w in n for w in args.only)]

    print(f"\nPython calls added per step on the training thread ({args.model} model)\n")
    print(f"{'configuration':46} {'ordinary':>8} {'mean':>7} {'bsmon':>6}  by category")
    for name in names[1:]:
        count = count_calls(CONFIGS[name], args.model, warmup=WARMUP.get(name, 50))
        parts = ", ".join(f"{k} {v:+d}" for k, v in count.by_category.items())
        print(f"{name:46} {count.ordinary:>+8d} {count.mean:>+7.1f} {count.bsmon:>+6d}  {parts}")
    if args.counts_only:
        return

    print(f"\nµs added per step, {args.rounds} rounds × {args.steps} steps on one model. Each")
    print("block's steps are timed one by one; a block less the mean of the bare blocks timed")
    print("just before and after it. ordinary: the median step; every step: the mean, each step")
    print(f"counted at most {CLIP:g}× the median (a step this machine stretched moves a block by")
    print("little); both + the CPU time of the threads the configuration started (bsmon's agent:")
    print("the GIL puts it on the training thread). Medians [IQR] over rounds; bare's own row is")
    print("the method's noise. threads and CPU (the training thread's): medians, µs a step\n")
    print(
        f"{'configuration':46} {'ordinary step':>21} {'every step':>21} {'threads':>7} {'CPU':>6}"
    )
    added = time_configs(names, args.model, args.rounds, args.steps)
    ordinary_us: dict[str, list[float]] = {}
    every_us: dict[str, list[float]] = {}
    for name in names:
        blocks = added[name]
        ordinary_us[name] = [(b.ordinary + b.others) * 1e6 for b in blocks]
        every_us[name] = [(b.wall + b.others) * 1e6 for b in blocks]
        others = statistics.median(b.others * 1e6 for b in blocks)
        cpu = statistics.median(b.cpu * 1e6 for b in blocks)
        print(
            f"{name:46} {spread(ordinary_us[name]):>21} {spread(every_us[name]):>21} "
            f"{others:7.1f} {cpu:+6.1f}"
        )
    print_goals({"ordinary step": ordinary_us, "every step": every_us})
    print(f"\nload average {os.getloadavg()[0]:.1f}; python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
