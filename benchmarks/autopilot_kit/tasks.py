"""The three tasks of benchmarks/autopilot.py: their data, their models, their optimizers and
the protocol's settings for each (docs in autopilot.py's docstring).

Three small tasks, deterministic given a seed, needing no download:

- **T1** ``synthetic``: a 10-class classification problem generated here the way
  scikit-learn's ``make_classification`` does it (40 features: 20 informative drawn from two
  Gaussian clusters per class at vertices of a hypercube, each cluster with its own random
  covariance, 2 redundant features, 18 of noise; 10% of the labels replaced at random),
  100,000 training and 4,096 held-out examples, standardised. MLP 40-256-256-10.
- **T2** ``charlm``: a character-level language model on the first ~3 MB of the running
  Python's own standard library sources (``*.py`` under ``sysconfig``'s stdlib, in sorted path
  order, tests and site-packages left out): 12 characters of context → the next one, 97
  symbols (newline, printable ASCII, one for anything else). The text is cut in blocks of
  4,096 characters and one block in 10 is held out: every window inside the other blocks is a
  training example (~2.7 million), 4,096 random windows inside the held-out blocks are the
  held-out set. Embedding(97, 16)×12 → 256 → 256 → 97.
- **T3** ``transformer``: the decoder-only transformer of benchmarks/noise_tracking.py (2
  pre-norm blocks of width 64, 4 heads) on sequences of its order-2 Markov chain (32 symbols,
  32 tokens of context; about 1.9 nats a symbol is the floor): 200,000 training sequences and
  1,024 held out, from the same chain. AdamW (β 0.9/0.999, weight decay 0.1), the family the
  round-two issue asks for: a different model, optimizer and learning-rate rule from T1/T2.

T1 and T2 train with SGD, momentum 0.9 (bsmon's learning-rate rule for SGD: linear); T3 with
AdamW (bsmon's rule for Adam-type: the square root). The data are fixed (generated from seed
0); a run's seed sets the model's initial weights and the order of the examples.
"""

from __future__ import annotations

import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
MakeOptimizer = Callable[[Any, float], torch.optim.Optimizer]

DATA_SEED = 0
CHAR_CONTEXT = 12
CHAR_TEXT_BYTES = 3_000_000
CHAR_BLOCK = 4096
HELD_OUT_EVERY = 10
HELD_OUT = 4096


class Pairs(Dataset):
    """Inputs and labels in two tensors; a whole batch is fetched with one index
    (``__getitems__``, which DataLoader calls when it exists), so the data path costs the same
    few microseconds whatever the batch and no per-example Python runs."""

    def __init__(self, inputs: torch.Tensor, labels: torch.Tensor) -> None:
        self.inputs, self.labels = inputs, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[index], self.labels[index]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.as_tensor(indices)
        return self.inputs[rows], self.labels[rows]


def whole_batch(batch: Any) -> Any:
    """The collate function: ``__getitems__`` already made the batch."""
    return batch


@dataclass(frozen=True)
class Data:
    train: Dataset
    held_out: tuple[torch.Tensor, torch.Tensor]


def sgd_momentum(params: Any, lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


@dataclass(frozen=True)
class Task:
    """One task: what it trains and the protocol's settings for it.

    ``targets``: held-out losses, loosest first; the last is the one the learning rates are
    tuned for. ``lr_centre``: the centre of each batch's learning-rate grid (the pilot's tuned
    rates, research/autopilot.md §6.1). ``warmup_default``: the linear warm-up (in examples)
    of the warm-up baselines when the autopilot's own ramp was not measured."""

    name: str
    title: str
    start_batch: int
    targets: tuple[float, ...]
    eval_every: int
    budget_examples: int
    lr_centre: dict[int, float]
    warmup_default: dict[int, int]
    model: Callable[[], nn.Module]
    data: Callable[[], Data]
    quick_targets: tuple[float, ...]
    quick_budget_examples: int
    optimizer: MakeOptimizer = sgd_momentum
    loss: LossFn = nn.functional.cross_entropy

    @property
    def batches(self) -> list[int]:
        """The fixed batches: B0, 4·B0, 16·B0, 64·B0."""
        return [self.start_batch * 4**k for k in range(4)]

    @property
    def ceiling(self) -> int:
        """The autopilot's ``max_batch_size``: 64·B0."""
        return 64 * self.start_batch


# -- T1: synthetic classification -------------------------------------------------------------


def make_classification(
    samples: int,
    *,
    features: int = 40,
    informative: int = 20,
    redundant: int = 2,
    classes: int = 10,
    clusters_per_class: int = 2,
    class_sep: float = 1.0,
    flip_y: float = 0.1,
    seed: int = DATA_SEED,
) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's ``make_classification`` recipe (not its random stream): Gaussian
    clusters at distinct vertices of a hypercube of side ``2·class_sep`` in the informative
    dimensions, each cluster stretched by its own random linear map; redundant features are
    random linear combinations of the informative ones; the rest is N(0, 1) noise; a fraction
    ``flip_y`` of the labels is replaced by a uniformly random class."""
    rng = np.random.default_rng(seed)
    clusters = classes * clusters_per_class
    vertices: set[tuple[int, ...]] = set()
    while len(vertices) < clusters:
        vertices.add(tuple(int(v) for v in rng.integers(0, 2, informative)))
    centroids = (np.array(sorted(vertices), dtype=np.float64) * 2 - 1) * class_sep
    rng.shuffle(centroids)
    x = np.zeros((samples, features))
    y = np.zeros(samples, dtype=np.int64)
    bounds = np.linspace(0, samples, clusters + 1).astype(int)
    for k in range(clusters):
        start, stop = bounds[k], bounds[k + 1]
        points = rng.standard_normal((stop - start, informative))
        stretch = 2 * rng.random((informative, informative)) - 1
        x[start:stop, :informative] = points @ stretch + centroids[k]
        y[start:stop] = k % classes
    mix = 2 * rng.random((informative, redundant)) - 1
    x[:, informative : informative + redundant] = x[:, :informative] @ mix
    x[:, informative + redundant :] = rng.standard_normal(
        (samples, features - informative - redundant)
    )
    flipped = rng.random(samples) < flip_y
    y[flipped] = rng.integers(0, classes, int(flipped.sum()))
    order = rng.permutation(samples)
    return x[order], y[order]


@cache
def synthetic_data() -> Data:
    train_size = 100_000
    x, y = make_classification(train_size + HELD_OUT)
    mean, std = x[:train_size].mean(0), x[:train_size].std(0)
    inputs = torch.from_numpy((x - mean) / std).float()
    labels = torch.from_numpy(y)
    return Data(
        Pairs(inputs[:train_size].contiguous(), labels[:train_size].contiguous()),
        (inputs[train_size:].contiguous(), labels[train_size:].contiguous()),
    )


def mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(40, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
    )


# -- T2: character-level language model on the standard library's sources ---------------------

SYMBOLS = "\n" + "".join(chr(c) for c in range(32, 127))  # 96, and one more for the rest
VOCAB = len(SYMBOLS) + 1


def stdlib_sources(limit: int = CHAR_TEXT_BYTES) -> str:
    """The first ``limit`` bytes (about) of the running Python's stdlib ``*.py`` files, in
    sorted path order; tests, IDLE's tests and site-packages are left out."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skipped = {"site-packages", "dist-packages", "test", "tests", "idle_test"}
    files = sorted(
        path
        for path in root.rglob("*.py")
        if not skipped.intersection(path.relative_to(root).parts[:-1])
    )
    parts, total = [], 0
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        total += len(text)
        if total >= limit:
            break
    return "".join(parts)[:limit]


def encode(text: str) -> np.ndarray:
    table = np.full(0x110000, len(SYMBOLS), dtype=np.uint8)
    for index, symbol in enumerate(SYMBOLS):
        table[ord(symbol)] = index
    return table[np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)]


class Windows(Dataset):
    """Every window of the text that starts at one of ``starts``: ``CHAR_CONTEXT`` characters
    and the one after them, cut when a batch is fetched (one gather for the whole batch)."""

    def __init__(self, codes: torch.Tensor, starts: torch.Tensor) -> None:
        self.codes, self.starts = codes, starts
        self.offsets = torch.arange(CHAR_CONTEXT + 1)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, labels = self.__getitems__([index])
        return inputs[0], labels[0]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.codes[self.starts[torch.as_tensor(indices)][:, None] + self.offsets]
        return rows[:, :CHAR_CONTEXT], rows[:, CHAR_CONTEXT]


@cache
def char_data() -> Data:
    """The text cut in blocks of ``CHAR_BLOCK`` characters, one block in ``HELD_OUT_EVERY``
    held out: training windows are every window inside the other blocks, the held-out ones
    ``HELD_OUT`` random windows inside the held-out blocks (the same files, never the same
    characters)."""
    codes = torch.from_numpy(encode(stdlib_sources()).astype(np.int64))
    blocks = len(codes) // CHAR_BLOCK
    inside = torch.arange(CHAR_BLOCK - CHAR_CONTEXT)
    held = torch.arange(blocks) % HELD_OUT_EVERY == HELD_OUT_EVERY - 1

    def starts(mask: torch.Tensor) -> torch.Tensor:
        return (torch.nonzero(mask).flatten()[:, None] * CHAR_BLOCK + inside).flatten()

    rng = np.random.default_rng(DATA_SEED)
    candidates = starts(held)
    chosen = candidates[torch.from_numpy(rng.choice(len(candidates), HELD_OUT, replace=False))]
    held_out = Windows(codes, chosen).__getitems__(list(range(HELD_OUT)))
    return Data(Windows(codes, starts(~held)), held_out)  # type: ignore[arg-type]


def char_mlp() -> nn.Module:
    return nn.Sequential(
        nn.Embedding(VOCAB, 16),
        nn.Flatten(),
        nn.Linear(16 * CHAR_CONTEXT, 256),
        nn.ReLU(),
        nn.Linear(256, 256),
        nn.ReLU(),
        nn.Linear(256, VOCAB),
    )


# -- T3: a small transformer with AdamW on a Markov chain's sequences -------------------------

SEQUENCES_HELD_OUT = 1024


class Sequences(Dataset):
    """Whole sequences of the chain: the first ``CONTEXT`` symbols in, each next one out."""

    def __init__(self, sequences: torch.Tensor) -> None:
        self.sequences = sequences

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, labels = self.__getitems__([index])
        return inputs[0], labels[0]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.sequences[torch.as_tensor(indices)]
        return rows[:, :-1], rows[:, 1:]


@cache
def markov_data() -> Data:
    from noise_tracking_kit.transformer import SEQUENCES, markov_sequences

    sequences = markov_sequences(SEQUENCES + SEQUENCES_HELD_OUT)
    held_out = Sequences(sequences[SEQUENCES:]).__getitems__(list(range(SEQUENCES_HELD_OUT)))
    return Data(Sequences(sequences[:SEQUENCES].contiguous()), held_out)


def decoder() -> nn.Module:
    from noise_tracking_kit.transformer import Decoder

    return Decoder()


def adamw(params: Any, lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.1)


def sequence_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    from noise_tracking_kit.transformer import sequence_loss as loss

    return loss(logits, labels)


TASKS: dict[str, Task] = {
    "synthetic": Task(
        name="synthetic",
        title="T1 synthetic 10-class, MLP 40-256-256-10, SGD momentum 0.9",
        start_batch=16,
        targets=(0.90, 0.85),
        eval_every=4096,
        budget_examples=480_000,
        lr_centre={16: 0.01, 64: 0.04, 256: 0.16, 1024: 0.64},
        warmup_default={256: 16_384, 1024: 49_152},
        model=mlp,
        data=synthetic_data,
        quick_targets=(1.0,),
        quick_budget_examples=160_000,
    ),
    "charlm": Task(
        name="charlm",
        title="T2 char-LM on the stdlib's sources, Embedding×12-256-256-97, SGD momentum 0.9",
        start_batch=32,
        targets=(1.70, 1.60),
        eval_every=8192,
        budget_examples=1_200_000,
        lr_centre={32: 0.025, 128: 0.1, 512: 0.4, 2048: 0.6},
        warmup_default={512: 32_768, 2048: 131_072},
        model=char_mlp,
        data=char_data,
        quick_targets=(2.0,),
        quick_budget_examples=400_000,
    ),
    "transformer": Task(
        name="transformer",
        title="T3 decoder transformer 2×64 on an order-2 Markov chain, AdamW (wd 0.1)",
        start_batch=16,
        targets=(2.10, 2.04),
        eval_every=4096,
        budget_examples=600_000,
        lr_centre={16: 0.003, 64: 0.006, 256: 0.012, 1024: 0.024},
        warmup_default={256: 16_384, 1024: 49_152},
        model=decoder,
        data=markov_data,
        quick_targets=(2.15,),
        quick_budget_examples=200_000,
        optimizer=adamw,
        loss=sequence_loss,
    ),
}
