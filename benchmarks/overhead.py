"""Step-time overhead of the bsmon agent and of its noise-scale estimator on CPU training
loops, measured side by side in one process.

Part 1, the agent: blocks of training steps alternate between ``off`` (no agent), ``agent``
(attached and serving, a monitor process connected and reading every message, the noise
scale turned off) and ``agent, no anatomy`` (the same without the step anatomy: what timing
each step's phases costs), the order rotated every round. Each block attaches afresh and runs
untimed warm-up steps first.

Part 2, the noise scale: three identical copies of the model each train with their own
monitor attached for the whole run — ``agent`` (noise scale off), ``noise`` (the defaults,
timed once the dense warm-up is over and the estimate is tracking under the cost budget) and
``noise-every-step`` (``noise_budget=None``: what the per-example norms themselves cost, and
what the warm-up costs) — and a fourth, ``floor``: the agent alone plus the least machinery
that computes the same per-example norms every step (``pernorm_floor.py``), the floor that
every-step measuring is compared with — in short interleaved blocks, so load from other
processes on a shared machine falls on all four alike. While one copy's block runs, the
others' forward watches are suspended: a global forward hook registered for one copy's next
measured step would otherwise slow the other copies' steps too.

Part 3, what a user would pick instead (``--compare``): the same loop logging its loss every
step to Weights & Biases (offline), to TensorBoard's ``SummaryWriter.add_scalar``, to bsmon
with the noise scale off (telemetry), and to bsmon at its defaults (tracking), against the
bare loop. W&B and TensorBoard take the loss as a Python float (``loss.item()``), as their
users write it; ``mon.log`` takes the tensor and never synchronises a device.

A variant's figure is the median over blocks; a ratio is the median of per-round ratios
(paired), with their interquartile range. Wall-clock, process CPU and training-thread CPU
time are reported; on a shared machine the training thread's CPU time at one thread
(``--threads 1``) is the steadiest, and for the noise scale, whose work is all on that thread,
the most telling. The noise scale's total overhead is about the agent's ratio times the noise
ratio. Goals: agent <= 1.01; the anatomy <= 1.01 against the agent without it; the noise
scale at its defaults, once tracking, <= 1.01 on the MLP and <= 1.02 on the CNN and the
transformer; every-step measuring within 1.03x of the floor. Figures are printed, never
asserted.

    python benchmarks/overhead.py                    # MLP, CNN and transformer block
    python benchmarks/overhead.py --model mlp --rounds 40 --threads 1
    python benchmarks/overhead.py --model mlp --compare   # + W&B and TensorBoard
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch
from overhead_kit.agent import NO_ANATOMY, bench_agent, start_reader
from overhead_kit.blocks import summary, table
from overhead_kit.compare import bench_compare
from overhead_kit.models import MODELS
from overhead_kit.noise import FLOOR, bench_noise


def run_model(name: str, args: argparse.Namespace) -> None:
    _, batch, label = MODELS[name]
    print(f"\n{name}: {label.format(batch=batch)}")
    if args.agent_rounds:
        print(f"  part 1, the agent ({args.agent_rounds} rounds x {args.agent_steps} steps):")
        agent_times = bench_agent(name, args)
        print("\n".join(table(agent_times, "off")))
        wall, _, thread = (summary(agent_times, NO_ANATOMY, k)["agent"][2] for k in range(3))
        print(f"  the step anatomy: agent vs {NO_ANATOMY}: wall {wall}, training thread {thread}")
    times, share = bench_noise(name, args)
    print(f"  part 2, the noise scale ({args.rounds} rounds x {args.block} steps, vs agent):")
    print("\n".join(table(times, "agent")))
    wall, _, thread = (summary(times, FLOOR, k)["noise-every-step"][2] for k in range(3))
    print(f"  every step vs the floor (goal <= 1.03): wall {wall}, training thread {thread}")
    print(
        f"  the dense warm-up ended after {args.warmed_up} steps; then the default budget "
        f"measured {share:.1%} of steps (a moving average)"
    )
    if args.compare:
        times, warmed = bench_compare(name, args, Path(tempfile.mkdtemp(prefix="bsm-tools-")))
        print(f"  part 3, what a user would pick instead ({args.rounds} rounds, vs bare):")
        print("\n".join(table(times, "bare")))
        print(f"  (bsmon defaults timed once tracking: the warm-up took {warmed} steps)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=[*MODELS, "all"], default="all")
    parser.add_argument("--rounds", type=int, default=30, help="noise-scale rounds")
    parser.add_argument("--block", type=int, default=25, help="steps per noise-scale block")
    parser.add_argument("--agent-rounds", type=int, default=8, help="0 skips part 1")
    parser.add_argument("--agent-steps", type=int, default=100, help="steps per agent block")
    parser.add_argument("--warmup", type=int, default=30, help="untimed steps per block")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--no-record", action="store_true", help="attach with record=False (no session record)"
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="part 3: W&B (offline) and TensorBoard in the same loop (pip install wandb "
        "tensorboard)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    directory = Path(tempfile.mkdtemp(prefix="bsm-bench-", dir="/tmp"))
    os.environ["BSMON_DIR"] = str(directory)
    socket_path = directory / f"{os.getpid()}.sock"
    reader = start_reader(socket_path)
    print(
        f"torch {torch.__version__}, {args.threads} threads, {os.cpu_count()} cores; "
        "ratios are medians of paired per-round ratios"
    )
    try:
        for name in list(MODELS) if args.model == "all" else [args.model]:
            run_model(name, args)
    finally:
        reader.kill()
        reader.wait()
    print(
        "\ngoals: agent <= 1.01; the noise scale at its defaults, once tracking, <= 1.01 (MLP) "
        "and <= 1.02 (CNN, transformer) against the agent alone"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
