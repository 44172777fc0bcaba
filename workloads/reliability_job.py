"""A training job for the reliability tests and benchmarks/reliability.py, run as a real process.

    python workloads/reliability_job.py NAME [--sleep S] [--width N] [--no-record] [--seconds S]

It attaches bsmon, trains a small model, and prints on stdout (flushed):

    ready <socket or -> <record or ->       once serving
    t <unix time> <steps> <samples>         every REPORT_S, from the training loop itself
    done <steps> <samples> <bsmon samples> <bsmon errors> <record or ->   after mon.close()

It stops when a line arrives on stdin (or stdin closes), after --seconds, or when killed.
``--sleep`` adds a pause inside each step (between backward and optimizer.step), so a kill
usually lands mid-step and the rate is steady; 0 runs as fast as it can.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

import torch
from torch import nn

from bsmon.probes import attach

REPORT_S = 0.05
BATCH = 8


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    parser.add_argument("--sleep", type=float, default=0.002)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument("--sample-interval", type=float, default=1.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)

    model = nn.Linear(args.width, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(BATCH, args.width)
    mon = attach(
        model,
        optimizer,
        batch_size=BATCH,
        name=args.name,
        record=not args.no_record,
        sample_interval_s=args.sample_interval,
    )
    stop = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.readline()
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    record = mon.session.record or "-"
    print("ready", mon.socket_path or "-", record, flush=True)
    steps = samples = 0
    deadline = time.monotonic() + args.seconds
    next_report = 0.0
    pause = args.sleep
    while not stop.is_set():
        loss = model(x).pow(2).mean()
        loss.backward()
        if pause:
            time.sleep(pause)
        mon.job.count_samples(BATCH)  # what the job trained on, whatever batch size bsmon was asked
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        steps += 1
        samples += BATCH
        now = time.monotonic()
        if now >= next_report:
            print("t", repr(time.time()), steps, samples, flush=True)
            next_report = now + REPORT_S
            if now > deadline:
                break
    mon.close()
    stats = mon.stats()
    print("done", steps, samples, stats["samples"], stats["errors"], record, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
