"""What the noise scale's warm-up costs a CNN over a run's first steps, and how soon it gives
B_simple (or says why not).

A ResNet-18-style CNN (BasicBlocks 2-2-2-2, BatchNorm after every convolution, in-place
ReLUs, a 1x1 projection on the shortcut where the shape changes; ``--width`` channels in the
first stage instead of 64, so that a CPU runs it; ``--norm group`` puts GroupNorm in place of
BatchNorm) trains on template images with noise (3 x ``--size`` x ``--size``, 10 classes),
SGD with momentum. Each round trains fresh copies of the model, seeded alike, one per variant:

- ``agent``: bsmon attached, the noise scale off — the base of the ratios;
- ``defaults``: bsmon's defaults (``auto``: on a BatchNorm CNN, micro-batch norms waiting for
  gradient accumulation; on a GroupNorm one, per-example norms under the warm-up's bound);
- ``per-example``: ``noise_scale="per_example"`` at the default budget: the warm-up's cost
  bound on the estimator ``auto`` chose for every CNN before;
- ``every step``: per-example norms on every step (``noise_budget=None``): what the warm-up
  cost before it had a bound (it measured every step for up to 300 steps);
- ``bare`` (``--bare``): no bsmon at all, for the total.

The copies' first ``--steps`` steps (300) run in interleaved blocks of ``--block`` steps, the
order rotated every block, so load from other processes falls on all alike; while one copy
runs, the others' forward watches are suspended (a global hook registered for one copy's
measured step would slow the others). A round's ratio is a variant's total time over those
steps against ``agent``'s; printed are the median over rounds and the range. Wall time and
the training thread's CPU time (``time.thread_time``, steadier on a shared machine).

Then the last round's estimating copies train on, one at a time, to ``--until`` steps (500,
untimed), and the benchmark prints when B_simple first showed (checked between blocks) or, if
it did not, the reason their reading gives, with the estimator and what the warm-up did.

Figures are printed, never asserted (docs/benchmarks.md keeps them).

    python benchmarks/warmup_cost.py                      # width 16, batch 32, 3 rounds
    python benchmarks/warmup_cost.py --batch 8 --batch 64 --rounds 5 --bare
    python benchmarks/warmup_cost.py --norm group
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

CLASSES = 10


def norm_layer(kind: str, channels: int) -> nn.Module:
    """BatchNorm (the ResNet's own), or GroupNorm with 8 groups (no coupling of the examples)."""
    return nn.BatchNorm2d(channels) if kind == "batch" else nn.GroupNorm(8, channels)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, norm: str = "batch") -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = norm_layer(norm, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = norm_layer(norm, cout)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), norm_layer(norm, cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18's layout at CIFAR scale: a 3x3 stem, four stages of two BasicBlocks."""

    def __init__(self, width: int = 16, classes: int = CLASSES, norm: str = "batch") -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, 1, 1, bias=False),
            norm_layer(norm, width),
            nn.ReLU(inplace=True),
        )
        blocks, cin = [], width
        for stage, mult in enumerate((1, 2, 4, 8)):
            for i in range(2):
                stride = 2 if stage and not i else 1
                blocks.append(BasicBlock(cin, width * mult, stride, norm))
                cin = width * mult
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.blocks(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(out, 1).flatten(1))


class Batches:
    """Template images with noise, drawn with a generator of their own (seeded alike for
    every copy, so each trains on the same batches)."""

    def __init__(self, batch: int, size: int, seed: int = 1) -> None:
        generator = torch.Generator().manual_seed(0)
        self.templates = 0.5 * torch.randn(CLASSES, 3, size, size, generator=generator)
        self.generator = torch.Generator().manual_seed(seed)
        self.batch, self.size = batch, size

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        g = self.generator
        labels = torch.randint(0, CLASSES, (self.batch,), generator=g)
        noise = torch.randn(self.batch, 3, self.size, self.size, generator=g)
        return self.templates[labels] + 2.0 * noise, labels


class Copy:
    """One model, its optimizer, its batches and (but for ``bare``) its monitor."""

    def __init__(self, variant: str, options: dict | None, args: argparse.Namespace) -> None:
        from bsmon.probes import attach

        torch.manual_seed(0)
        self.variant = variant
        self.model = ResNet18(args.width, norm=args.norm)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.batches = Batches(args.batch_size, args.size)
        self.mon = None
        if options is not None:
            self.mon = attach(
                self.model,
                self.optimizer,
                batch_size=args.batch_size,
                name=f"warmup-{variant}",
                serve=False,
                record=False,
                **options,
            )
        self.wall = self.cpu = 0.0
        self.steps = 0

    def step(self) -> None:
        x, y = self.batches()
        loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1

    def timed(self, steps: int) -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        for _ in range(steps):
            self.step()
        self.wall += time.perf_counter() - wall
        self.cpu += time.thread_time() - cpu

    def noise(self) -> dict:
        assert self.mon is not None
        self.mon.flush()
        return self.mon.stats()["noise"]

    def close(self) -> None:
        if self.mon is not None:
            self.mon.close()


VARIANTS: dict[str, dict | None] = {
    "agent": {"noise_scale": None},
    "defaults": {},
    "per-example": {"noise_scale": "per_example"},
    "every step": {"noise_scale": "per_example", "noise_budget": None},
}


@contextlib.contextmanager
def alone(copy: Copy, copies: list[Copy]) -> Iterator[None]:
    """Every other copy's forward watch suspended while ``copy`` runs."""
    with contextlib.ExitStack() as stack:
        for other in copies:
            if other is not copy and other.mon is not None:
                stack.enter_context(other.mon._watch.suspended())  # type: ignore[attr-defined]
        yield


ESTIMATING = ("defaults", "per-example", "every step")  # whose B_simple is followed


def one_round(args: argparse.Namespace, index: int) -> tuple[dict[str, Copy], dict[str, int]]:
    """Fresh copies, their first ``args.steps`` steps timed in interleaved blocks; returns
    them and the step by which each estimating copy first showed B_simple."""
    variants = dict(VARIANTS)
    if args.bare:
        variants["bare"] = None
    copies = {v: Copy(v, options, args) for v, options in variants.items()}
    order = list(copies)
    first: dict[str, int] = {}
    for block in range(0, args.steps, args.block):
        shift = (block // args.block + index) % len(order)
        for variant in order[shift:] + order[:shift]:
            copy = copies[variant]
            with alone(copy, list(copies.values())):
                copy.timed(min(args.block, args.steps - block))
        watch(copies, first)
    return copies, first


def watch(copies: dict[str, Copy], first: dict[str, int]) -> None:
    for variant in ESTIMATING:
        copy = copies[variant]
        if variant not in first and copy.noise()["b_simple"] is not None:
            first[variant] = copy.steps


def spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--norm", choices=("batch", "group"), default="batch")
    parser.add_argument("--batch", type=int, action="append", help="repeatable (default 32)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300, help="timed steps per copy")
    parser.add_argument("--block", type=int, default=25)
    parser.add_argument("--until", type=int, default=500, help="steps for the estimate")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--bare", action="store_true", help="time a copy without bsmon too")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["BSMON_DIR"] = tempfile.mkdtemp(prefix="bsm-warmup-")
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), {os.cpu_count()} cores; "
        f"ResNet-18-style, {args.norm} norm, width {args.width}, 3x{args.size}x{args.size}; "
        "ratios over the "
        f"first {args.steps} steps against 'agent' (median [min-max] of {args.rounds} rounds)"
    )
    for batch in args.batch or [32]:
        args.batch_size = batch
        ratios: dict[str, list[tuple[float, float]]] = {}
        firsts: list[dict[str, int]] = []
        copies: dict[str, Copy] = {}
        for index in range(args.rounds):
            for copy in copies.values():
                copy.close()
            copies, first = one_round(args, index)
            firsts.append(first)
            base = copies["agent"]
            for variant, copy in copies.items():
                ratios.setdefault(variant, []).append((copy.wall / base.wall, copy.cpu / base.cpu))
        per_step = copies["agent"].wall / args.steps
        print(f"\nbatch {batch} ({per_step * 1e3:.0f} ms a step with the agent alone)")
        print(f"  {'variant':<12}{'wall':>26}{'training-thread CPU':>30}")
        for variant, pairs in ratios.items():
            wall = spread([w for w, _ in pairs])
            cpu = spread([c for _, c in pairs])
            print(f"  {variant:<12}{wall:>26}{cpu:>30}")
        for variant in ("defaults", "per-example"):
            noise = copies[variant].mon._noise  # type: ignore[union-attr]
            print(
                f"  {variant}: {noise.source.estimator if noise.source else None}, "
                f"{noise.warmup.measured} steps measured by the warm-up in the first {args.steps}"
            )
        report_estimates(copies, args, firsts)
        for copy in copies.values():
            copy.close()
    return 0


def report_estimates(
    copies: dict[str, Copy], args: argparse.Namespace, firsts: list[dict[str, int]]
) -> None:
    """The last round's estimating copies train on (untimed, alone) to ``args.until`` steps:
    when B_simple first showed in each round, and the reading at the end."""
    last = firsts[-1]
    for variant in ESTIMATING:
        copy = copies[variant]
        with alone(copy, list(copies.values())):
            while copy.steps < args.until and variant not in last:
                copy.timed(min(args.block, args.until - copy.steps))
                if copy.noise()["b_simple"] is not None:
                    last[variant] = copy.steps
        shown = ", ".join(str(f.get(variant, "-")) for f in firsts)
        print(
            f"  {variant}: B_simple first shown by step {shown} (per round, checked every "
            f"{args.block} steps; '-': not by step {args.steps}, the last round's by {args.until})"
        )
        reading = copy.noise()
        if reading["b_simple"] is not None:
            value = f"{reading['b_simple']:.3g} ± {reading['stderr']:.2g}"
            print(f"    B_simple {value} at step {copy.steps}")
        else:
            print(
                f"    none at step {copy.steps}: {reading.get('note')}; measured "
                f"{reading['samples']} steps (effective {reading['effective']} of "
                f"{reading['needed']}); lower bound {reading.get('lower_bound')}"
            )
        print(f"    {reading['estimator']}: {reading['detail']}")


if __name__ == "__main__":
    sys.exit(main())
