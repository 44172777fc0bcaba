"""Step-time overhead of the bsmon agent on a CPU training loop, measured side by side.

In one process, blocks of training steps alternate between "off" (no agent) and "on" (agent
attached, serving its socket, with a separate monitor process connected and reading every
message), in ABBA order so drift and warm-up affect both alike. Each variant's figure is the
median over blocks of the mean step time; the ratio on/off is the overhead (goal: <= 1.01).

    python benchmarks/overhead.py            # defaults: MLP, ~5 ms steps, 12 rounds
    python benchmarks/overhead.py --rounds 20 --steps 300
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

READER = """
import os, sys, time
from bsmon.probes.client import JobConnection
path, received, parent = sys.argv[1], 0, os.getppid()
while os.getppid() == parent:  # a benchmark killed by a timeout must not leave this behind
    try:
        with JobConnection(path, timeout=1.0) as conn:
            while not conn.eof and os.getppid() == parent:
                received += len(conn.pump(0.5))
    except (ConnectionError, OSError):
        time.sleep(0.01)
"""


def make_job(batch: int) -> tuple[nn.Module, torch.optim.Optimizer, Callable[[], None]]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(256, 640), nn.ReLU(), nn.Linear(640, 640), nn.ReLU(), nn.Linear(640, 10)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, 256), torch.randint(0, 10, (batch,))
    loss_fn = nn.CrossEntropyLoss()

    def step(mon: object | None = None) -> None:
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if mon is not None:
            mon.log(loss=loss)  # type: ignore[attr-defined]

    return model, optimizer, step


def time_block(step: Callable, steps: int, mon: object | None) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        step(mon)
    return (time.perf_counter() - start) / steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=200, help="steps per block")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--no-record", action="store_true", help="attach with record=False (no session record)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from bsmon.probes import attach

    directory = Path(tempfile.mkdtemp(prefix="bsm-bench-", dir="/tmp"))
    os.environ["BSMON_DIR"] = str(directory)
    model, optimizer, step = make_job(args.batch)
    socket_path = directory / f"{os.getpid()}.sock"
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(socket_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    times: dict[str, list[float]] = {"off": [], "on": []}
    try:
        for _ in range(50):
            step()  # warm-up
        for round_ in range(args.rounds):
            order = ("off", "on") if round_ % 2 == 0 else ("on", "off")
            for variant in order:
                if variant == "on":
                    mon = attach(
                        model,
                        optimizer,
                        batch_size=args.batch,
                        name="bench",
                        record=not args.no_record,
                    )
                    time.sleep(0.2)  # let the reader connect
                    times["on"].append(time_block(step, args.steps, mon))
                    mon.close()
                else:
                    times["off"].append(time_block(step, args.steps, None))
    finally:
        reader.kill()
        reader.wait()

    off = statistics.median(times["off"])
    on = statistics.median(times["on"])
    print(
        f"torch {torch.__version__}, {args.threads} threads, batch {args.batch}, "
        f"{args.rounds} rounds x {args.steps} steps per variant, "
        f"session record {'off' if args.no_record else 'on'}"
    )
    print(f"{'variant':<10}{'median step':>14}{'min':>10}{'max':>10}")
    for name, values in times.items():
        print(
            f"{name:<10}{statistics.median(values) * 1e3:>11.3f} ms"
            f"{min(values) * 1e3:>8.3f}{max(values) * 1e3:>10.3f}"
        )
    print(f"overhead ratio on/off: {on / off:.4f}  (goal <= 1.01)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
