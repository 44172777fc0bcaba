"""A training script that never imports bsmon, for the `bsmon run --resizable` tests.

    python resizable_job.py [--epochs N] [--samples N] [--batch N] [--workers N]
                            [--drop-last] [--batch-norm] [--one-cycle] [--iterable]
                            [--own-sampler] [--read-len] [--gate PATH]

Each step prints ``step S epoch E batch B: i i i …`` (the dataset indices of its batch) and
at the end ``done``. With ``--gate PATH`` it waits after its third step until PATH exists (the
test sends its batch-size command meanwhile), at most 60 s.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset, SequentialSampler


class Indexed(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((4,), float(i)), i


class Stream(IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            yield torch.full((4,), float(i)), i


class PairsSampler(BatchSampler):
    """A batch sampler of the script's own (the kind bsmon must refuse to resize)."""


def loader(args: argparse.Namespace) -> DataLoader:
    common = {"num_workers": args.workers, "generator": torch.Generator().manual_seed(1)}
    if args.iterable:
        return DataLoader(Stream(args.samples), batch_size=args.batch, **common)
    data = Indexed(args.samples)
    if args.own_sampler:
        sampler = PairsSampler(SequentialSampler(data), args.batch, drop_last=False)
        return DataLoader(data, batch_sampler=sampler, **common)
    return DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=args.drop_last, **common)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=96)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--workers", type=int, default=0)
    for flag in ("drop-last", "batch-norm", "one-cycle", "iterable", "own-sampler", "read-len"):
        parser.add_argument(f"--{flag}", action="store_true")
    parser.add_argument("--gate", default=None)
    args = parser.parse_args()

    torch.manual_seed(0)
    train = loader(args)
    norm = [nn.BatchNorm1d(8)] if args.batch_norm else []
    model = nn.Sequential(nn.Linear(4, 8), *norm, nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scheduler = None
    if args.one_cycle:
        total = args.epochs * len(train)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=total)
    step = 0
    for epoch in range(args.epochs):
        if args.read_len:
            print(f"epoch {epoch}: {len(train)} batches", flush=True)
        for x, ids in train:
            model(x).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            if scheduler is not None:
                scheduler.step()
            step += 1
            print(f"step {step} epoch {epoch} batch {len(ids)}: {' '.join(map(str, ids.tolist()))}")
            sys.stdout.flush()
            if args.gate and step == 3:
                deadline = time.monotonic() + 60
                while not os.path.exists(args.gate) and time.monotonic() < deadline:
                    time.sleep(0.05)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
