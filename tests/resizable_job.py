"""A training script that never imports bsmon, for the `bsmon run --resizable` tests.

    python resizable_job.py [--epochs N] [--samples N] [--batch N] [--workers N]
                            [--drop-last] [--batch-norm] [--one-cycle] [--cosine]
                            [--iterable] [--own-sampler] [--read-len] [--ddp]
                            [--gate PATH] [--loss outside|criterion|model]
                            [--accumulate K] [--fresh] [--two-optimizers]
                            [--eval-gate PATH]

Each step prints ``step S epoch E batch B: i i i …`` (the dataset indices of its batch; with a
scheduler, ``lr L`` after the batch size) and at the end ``done``. With ``--gate PATH`` it
waits after its third step until PATH exists (the test sends its batch-size command
meanwhile), at most 60 s. ``--loss``: computed in the loop (default), by an ``nn.MSELoss``
module, or by the model itself (it returns (output, loss)). With ``--ddp`` (under torchrun)
it trains a DistributedDataParallel model on a DistributedSampler's shard (gloo) and prefixes
every line with ``rank R``. ``--accumulate K`` steps the optimizer once every K batches;
``--fresh`` builds a new DataLoader for every epoch. ``--two-optimizers`` trains a second
model with its own Adam on the same batches after each step, as a GAN's two do, and prints
``lrs A B`` (both learning rates) before ``done``. ``--eval-gate PATH`` evaluates the model
after each epoch (``model.eval()``, ``torch.no_grad()``, a DataLoader of its own); the first
evaluation creates ``PATH.evaluating`` and goes on evaluating until PATH exists, at most 60 s.
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
        return torch.full((4,), i / self.n), i


class Stream(IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            yield torch.full((4,), i / self.n), i


class SelfLoss(nn.Module):
    """A model that computes its own loss when given targets, as nanoGPT's does."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.body(x)
        return out, nn.functional.mse_loss(out, target)


class PairsSampler(BatchSampler):
    """A batch sampler of the script's own (the kind bsmon must refuse to resize)."""


def loader(args: argparse.Namespace) -> DataLoader:
    common = {"num_workers": args.workers, "generator": torch.Generator().manual_seed(1)}
    if args.iterable:
        return DataLoader(Stream(args.samples), batch_size=args.batch, **common)
    data = Indexed(args.samples)
    if args.ddp:
        shard = torch.utils.data.DistributedSampler(data, seed=1)
        return DataLoader(data, batch_size=args.batch, sampler=shard, **common)
    if args.own_sampler:
        sampler = PairsSampler(SequentialSampler(data), args.batch, drop_last=False)
        return DataLoader(data, batch_sampler=sampler, **common)
    return DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=args.drop_last, **common)


def evaluate(model: nn.Module, samples: int, gate: str | None) -> None:
    """An evaluation pass; with ``gate``, repeated until it exists (at most 60 s)."""
    model.eval()
    held = DataLoader(Indexed(samples), batch_size=32)
    deadline = time.monotonic() + 60
    if gate is not None:
        open(f"{gate}.evaluating", "w").close()
    with torch.no_grad():
        while True:
            for x, _ in held:
                model(x)
            if gate is None or os.path.exists(gate) or time.monotonic() > deadline:
                break
    model.train()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=96)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--workers", type=int, default=0)
    flags = ("drop-last", "batch-norm", "one-cycle", "cosine", "iterable", "own-sampler")
    flags += ("read-len", "ddp", "fresh", "two-optimizers")
    for flag in flags:
        parser.add_argument(f"--{flag}", action="store_true")
    parser.add_argument("--gate", default=None)
    parser.add_argument("--eval-gate", default=None)
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--loss", choices=("outside", "criterion", "model"), default="outside")
    args = parser.parse_args()

    torch.manual_seed(0)
    prefix = ""
    if args.ddp:
        torch.distributed.init_process_group("gloo")
        prefix = f"rank {torch.distributed.get_rank()} "
    train = loader(args)
    norm = [nn.BatchNorm1d(8)] if args.batch_norm else []
    model = nn.Sequential(nn.Linear(4, 8), *norm, nn.Linear(8, 1))
    if args.loss == "model":
        model = SelfLoss(model)
    if args.ddp:
        model = nn.parallel.DistributedDataParallel(model)
    criterion = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scheduler = None
    if args.one_cycle:
        total = args.epochs * len(train)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=total)
    if args.cosine:
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=100)
    second = nn.Linear(4, 1)
    second_optimizer = torch.optim.Adam(second.parameters(), lr=0.001)
    step = 0
    for epoch in range(args.epochs):
        if args.fresh and epoch:
            train = loader(args)
        if args.ddp:
            train.sampler.set_epoch(epoch)
        if args.read_len:
            print(f"epoch {epoch}: {len(train)} batches", flush=True)
        for x, ids in train:
            target = x[:, :1] * 2
            if args.loss == "criterion":
                loss = criterion(model(x), target)
            elif args.loss == "model":
                loss = model(x, target)[1]
            else:
                loss = model(x).pow(2).mean()
            loss.backward()
            step += 1
            if step % args.accumulate == 0:
                optimizer.step()
                optimizer.zero_grad()
                if scheduler is not None:
                    scheduler.step()
            if args.two_optimizers:
                second(x).pow(2).mean().backward()
                second_optimizer.step()
                second_optimizer.zero_grad()
            indices = " ".join(map(str, ids.tolist()))
            lr = f" lr {optimizer.param_groups[0]['lr']:.6f}" if scheduler is not None else ""
            print(f"{prefix}step {step} epoch {epoch} batch {len(ids)}{lr}: {indices}")
            sys.stdout.flush()
            if args.gate and step == 3:
                deadline = time.monotonic() + 60
                while not os.path.exists(args.gate) and time.monotonic() < deadline:
                    time.sleep(0.05)
        if args.eval_gate:
            evaluate(model, args.samples, args.eval_gate if epoch == 0 else None)
    if args.two_optimizers:
        lrs = (optimizer.param_groups[0]["lr"], second_optimizer.param_groups[0]["lr"])
        print(f"{prefix}lrs {lrs[0]:.6f} {lrs[1]:.6f}")
    print(f"{prefix}done", flush=True)
    if args.ddp:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
