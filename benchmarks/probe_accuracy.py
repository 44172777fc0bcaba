"""How close the probe's prediction comes to the real boundary, found by brute force.

For each model (an MLP, a small CNN, a transformer block): a job trains a few steps with the
agent attached; the probe runs (at most three sidecar sizes) and predicts the largest batch;
then a binary search runs the sidecar at one size at a time, each in a fresh process, to find
the largest batch that really fits. On a CPU the memory budget plays the device (peak resident
memory of the sidecar); on a GPU the sidecar's allocator cap does, and a size fits when it
does not raise an out-of-memory error.

    python benchmarks/probe_accuracy.py [--budget 1.5G] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec
import torch
from torch import nn

from bsmon.probes import attach
from bsmon.probes.maxbatch import recipe as recipes
from bsmon.probes.maxbatch.runner import sidecar_environment
from bsmon.probes.wire.protocol import ProbePoint, ProbeResult


class TransformerBlock(nn.Module):
    def __init__(self, d: int = 128, tokens: int = 32) -> None:
        super().__init__()
        self.embed = nn.Linear(32, d)
        self.block = nn.TransformerEncoderLayer(d, 4, 4 * d, batch_first=True)
        self.head = nn.Linear(d, 10)
        self.tokens = tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.embed(x)).mean(1))


def jobs() -> dict[str, tuple[nn.Module, torch.utils.data.Dataset]]:
    n = 256
    return {
        "mlp": (
            nn.Sequential(
                nn.Linear(256, 1024),
                nn.ReLU(),
                nn.Linear(1024, 1024),
                nn.ReLU(),
                nn.Linear(1024, 10),
            ),
            torch.utils.data.TensorDataset(torch.randn(n, 256), torch.randint(0, 10, (n,))),
        ),
        "cnn": (
            nn.Sequential(
                nn.Conv2d(3, 16, 3, padding=1),
                nn.ReLU(),
                nn.Conv2d(16, 64, 3, padding=1, stride=2),
                nn.ReLU(),
                nn.AdaptiveAvgPool2d(1),
                nn.Flatten(),
                nn.Linear(64, 10),
            ),
            torch.utils.data.TensorDataset(torch.randn(n, 3, 16, 16), torch.randint(0, 10, (n,))),
        ),
        "transformer": (
            TransformerBlock(),
            torch.utils.data.TensorDataset(torch.randn(n, 32, 32), torch.randint(0, 10, (n,))),
        ),
    }


def measure_once(recipe: recipes.Recipe, size: int, directory: Path) -> ProbePoint:
    """Run the sidecar at exactly one size in a fresh process."""
    recipe.sizes = [size]
    path = recipes.write(recipe, directory)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "bsmon.probes.maxbatch.sidecar", str(path)],
            capture_output=True,
            env=sidecar_environment(),
            timeout=600,
            check=False,
        )
    finally:
        path.unlink(missing_ok=True)
    for line in out.stdout.splitlines():
        message = msgspec.json.decode(line)
        if message.get("type") == "point":
            return msgspec.convert(message["point"], ProbePoint)
    raise RuntimeError(f"no point from the sidecar at {size}: {out.stderr.decode()[-500:]}")


@dataclass
class Search:
    """A brute-force search: the largest size that fit, the smallest that failed, each trial
    as (size, fits), and whether it narrowed to its tolerance within its runs."""

    boundary: int
    failed: int | None
    trials: list[tuple[int, bool]]
    converged: bool


def fits_alone(recipe: recipes.Recipe, directory: Path, size: int) -> bool:
    return measure_once(recipe, size, directory).fits


def brute_force(
    fits: Callable[[int], bool],
    low: int,
    high: int,
    tolerance: float = 0.005,
    max_runs: int | None = None,
    high_fails: bool = False,
) -> Search:
    """The largest size from ``low`` (which must fit) that ``fits``: try ``high`` (unless it
    is known to fail), double it while it fits, then bisect until the bracket is within
    ``tolerance`` of ``low``."""
    trials: list[tuple[int, bool]] = []

    def trial(size: int) -> bool:
        ok = fits(size)
        trials.append((size, ok))
        return ok

    def out_of_runs() -> bool:
        return max_runs is not None and len(trials) >= max_runs

    while not high_fails and trial(high):  # grow until a size fails
        if out_of_runs():
            return Search(high, None, trials, converged=False)
        low, high = high, high * 2
    while high - low > max(1, low * tolerance):
        if out_of_runs():
            return Search(low, high, trials, converged=False)
        middle = (low + high) // 2
        if trial(middle):
            low = middle
        else:
            high = middle
    return Search(low, high, trials, converged=True)


def raw_prediction(result: ProbeResult) -> int:
    """The fitted line's boundary: the prediction before its safety margin."""
    return round((result.predicted_max or 0) / (1 - result.margin))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="0.75G", help="CPU memory budget (e.g. 0.75G)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--only", nargs="*", default=None, help="models to run")
    args = parser.parse_args()
    budget = int(float(args.budget.rstrip("G")) * 2**30)
    device = torch.device(args.device)
    directory = Path(tempfile.mkdtemp(prefix="bsm-acc-", dir="/tmp"))
    os.environ["BSMON_DIR"] = str(directory)
    torch.manual_seed(0)
    print(
        f"device {device}, "
        + (
            f"budget {budget / 2**30:.2f} GiB of resident memory"
            if device.type == "cpu"
            else "the sidecar's allocator cap"
        )
    )
    print(
        f"{'model':<12}{'sizes':>6}{'probe s':>9}{'predicted':>11}{'raw':>9}"
        f"{'boundary':>10}{'error':>8}{'brute runs':>12}{'brute s':>9}"
    )
    for name, (cpu_model, data) in jobs().items():
        if args.only and name not in args.only:
            continue
        model = cpu_model.to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        mon = attach(
            model, optimizer, batch_size=32, loss_fn=nn.CrossEntropyLoss(), name=f"acc-{name}"
        )
        for i, (x, y) in enumerate(mon.dataloader(data)):
            nn.functional.cross_entropy(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
            optimizer.zero_grad()
            if i == 2:
                break
        started = time.monotonic()
        result = mon.probe(memory_budget=budget if device.type == "cpu" else None, timeout=900)
        probe_s = time.monotonic() - started
        if result.status != "ok" or not result.predicted_max:
            print(f"{name:<12} probe {result.status}: {result.error}")
            mon.close()
            continue
        raw = raw_prediction(result)
        recipe = mon.job.probe_source.recipe(budget if device.type == "cpu" else None)
        mon.close()
        started = time.monotonic()
        search = brute_force(
            functools.partial(fits_alone, recipe, directory), result.max_batch_size, raw
        )
        brute_s = time.monotonic() - started
        error = raw / search.boundary - 1
        print(
            f"{name:<12}{len(result.points):>6}{probe_s:>9.1f}{result.predicted_max:>11,}"
            f"{raw:>9,}{search.boundary:>10,}{error:>+8.1%}{len(search.trials):>12}"
            f"{brute_s:>9.1f}"
        )
    print(
        "predicted: with the 5% margin; raw: the fitted line's boundary; error: raw vs the "
        "brute-force boundary"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
