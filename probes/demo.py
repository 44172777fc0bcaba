"""The demo training job behind ``bsmon demo``: a small CNN on generated images.

It is a real training loop with the agent attached: ten classes of 16x16 images, each a
fixed random template plus noise, learned by a three-layer CNN with SGD. It runs on the GPU
when there is one, else on the CPU, until stopped (or for ``--steps``).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

import torch
from torch import nn

from .agent import attach

IMAGE = 16
CLASSES = 10


class DemoCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1, stride=2),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1, stride=2),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(64, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def make_dataset(samples: int, seed: int = 0, noise: float = 3.0) -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    templates = 0.5 * torch.randn(CLASSES, 1, IMAGE, IMAGE, generator=generator)
    labels = torch.randint(0, CLASSES, (samples,), generator=generator)
    images = templates[labels] + noise * torch.randn(samples, 1, IMAGE, IMAGE, generator=generator)
    return torch.utils.data.TensorDataset(images, labels)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bsmon.probes.demo", description=__doc__)
    parser.add_argument("--name", default="demo")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--steps", type=int, default=0, help="stop after N steps (0: run until stopped)"
    )
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument(
        "--threads", type=int, default=0, help="torch CPU threads (0: half the cores)"
    )
    parser.add_argument(
        "--report-every",
        type=float,
        default=5.0,
        help="print a progress line every N seconds (0: never)",
    )
    parser.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="stop when the process that started the job goes away",
    )
    args = parser.parse_args(argv)
    if args.batch_size < 1 or args.steps < 0 or args.samples < 1:
        parser.error("--batch-size and --samples must be positive, --steps not negative")
    return args


def pick_device(choice: str) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise SystemExit("demo: --device cuda was asked for, but torch sees no CUDA device")
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(choice)


def watch_parent(on_orphaned: Callable[[], None], interval_s: float = 0.5) -> None:
    """Call ``on_orphaned`` once the parent process has exited (e.g. its terminal closed)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        on_orphaned()

    threading.Thread(target=watch, name="demo-parent-watch", daemon=True).start()


def run(args: argparse.Namespace) -> int:
    torch.manual_seed(0)
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 2) // 2))
    device = pick_device(args.device)
    model = DemoCNN().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    dataset = make_dataset(args.samples)
    stop = False

    def request_stop(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, request_stop)
    if args.exit_with_parent:
        watch_parent(lambda: request_stop(0, None))
    with attach(
        model,
        optimizer,
        batch_size=args.batch_size,
        name=args.name,
        loss_fn=loss_fn,
    ) as mon:
        print(
            f"demo: training on {device}; monitor it with `bsmon attach {args.name}` "
            f"(socket {mon.socket_path})",
            flush=True,
        )
        loader = mon.dataloader(dataset, shuffle=True, drop_last=False)
        last_report = time.monotonic()
        try:
            while not stop:
                for batch_images, batch_labels in loader:
                    images, labels = batch_images.to(device), batch_labels.to(device)
                    logits = model(images)
                    loss = loss_fn(logits, labels)
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    accuracy = (logits.argmax(1) == labels).float().mean()
                    mon.log(loss=loss, accuracy=accuracy)
                    if args.report_every and time.monotonic() - last_report >= args.report_every:
                        last_report = time.monotonic()
                        stats = mon.stats()
                        b_simple = stats["b_simple"]
                        noise = f"{b_simple:.0f}" if b_simple is not None else "collecting"
                        print(
                            f"demo: step {stats['step']} loss {loss.item():.4f} "
                            f"batch {mon.batch_size} B_simple {noise}",
                            flush=True,
                        )
                    if stop or (args.steps and mon.step >= args.steps):
                        stop = True
                        break
        except KeyboardInterrupt:
            pass
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
