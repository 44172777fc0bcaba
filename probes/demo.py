"""The demo training job behind ``bsmon demo``: a small CNN on generated images.

It is a real training loop with the agent attached: ten classes of 16x16 images, each a
fixed random template plus noise, learned by a three-layer CNN with SGD. It runs on the GPU
when there is one, else on the CPU, until stopped (or for ``--steps``). ``--model lm``
trains a small causal transformer on generated text instead (a sequence model: the
dashboard shows its tokens per second and MFU).
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
import torch.nn.functional as F
from torch import nn

from .agent import attach

IMAGE = 16
CLASSES = 10
VOCAB = 32  # the text's symbols
CONTEXT = 32  # tokens per example


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


class TransformerBlock(nn.Module):
    """Pre-norm causal self-attention and MLP, as in GPT-2 (benchmarks/gpucheck's GPT too)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, tokens, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, tokens, width))
        return x + self.mlp(self.norm2(x))


class DemoLM(nn.Module):
    """A small causal transformer over ``VOCAB`` symbols: next-symbol logits at each place."""

    def __init__(self, width: int = 32, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.blocks = nn.Sequential(*(TransformerBlock(width, 4) for _ in range(layers)))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln_f(self.blocks(self.embed(idx))))


class TokenLoss(nn.Module):
    """Cross-entropy over every position: logits (B, T, V) against targets (B, T)."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def make_text_dataset(samples: int, seed: int = 0) -> torch.utils.data.TensorDataset:
    """Windows of ``CONTEXT`` symbols of a periodic text with noise (learnable, never to zero
    loss), each with the window one symbol on as its targets."""
    generator = torch.Generator().manual_seed(seed)
    places = torch.arange(samples + CONTEXT + 1, dtype=torch.float32)
    text = (10 * (1 + torch.sin(places / 3))).long()
    text = (text + torch.randint(0, 4, text.shape, generator=generator)) % VOCAB
    windows = text.unfold(0, CONTEXT + 1, 1)[:samples]
    return torch.utils.data.TensorDataset(windows[:, :-1].clone(), windows[:, 1:].clone())


def make_dataset(samples: int, seed: int = 0, noise: float = 3.0) -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    templates = 0.5 * torch.randn(CLASSES, 1, IMAGE, IMAGE, generator=generator)
    labels = torch.randint(0, CLASSES, (samples,), generator=generator)
    images = templates[labels] + noise * torch.randn(samples, 1, IMAGE, IMAGE, generator=generator)
    return torch.utils.data.TensorDataset(images, labels)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bsmon.probes.demo", description=__doc__)
    parser.add_argument("--name", default="demo")
    parser.add_argument(
        "--model",
        choices=("cnn", "lm"),
        default="cnn",
        help="cnn: images (the default); lm: a sequence model (tokens/s and MFU)",
    )
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
    if args.model == "lm":
        model: nn.Module = DemoLM().to(device)
        loss_fn: nn.Module = TokenLoss()
        dataset = make_text_dataset(args.samples)
    else:
        model, loss_fn, dataset = (
            DemoCNN().to(device),
            nn.CrossEntropyLoss(),
            make_dataset(args.samples),
        )
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
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
                    accuracy = (logits.argmax(-1) == labels).float().mean()
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
