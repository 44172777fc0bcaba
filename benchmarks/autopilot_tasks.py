"""The tasks and the training loop of benchmarks/autopilot.py (docs in its docstring).

Two small tasks, deterministic given a seed, needing no download:

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

Both train with SGD, momentum 0.9 (bsmon's learning-rate rule for SGD: linear). The data are
fixed (generated from seed 0); a run's seed sets the model's initial weights and the order of
the examples.

``train`` runs one arm (a fixed batch, a fixed batch with a linear learning-rate warm-up, or
bsmon's autopilot from the start batch) until the held-out loss reaches the last target, the
examples run out, the loss diverges or the wall-clock cap is hit. The held-out loss is
measured every ``eval_every`` examples under ``torch.no_grad()`` in ``eval()`` mode (bsmon
keeps that time out of its step times) and its time is kept out of the run's wall-clock.
"""

from __future__ import annotations

import math
import statistics
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

DATA_SEED = 0
CHAR_CONTEXT = 12
CHAR_TEXT_BYTES = 3_000_000
CHAR_BLOCK = 4096
HELD_OUT_EVERY = 10
HELD_OUT = 4096
DIVERGED_FACTOR = 3.0  # a held-out loss this many times the initial one: the run diverged


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
}


# -- one run ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arm:
    """What a run trains with. ``autopilot``: bsmon steers from ``batch`` (the start batch)
    with ``half`` declared as B½ (None: fitted from the job's own step times). ``ramp_to``:
    no monitor; the batch follows ``ramp_size``, the fastest ramp from ``batch`` to this size
    that the autopilot's guards allow, the learning rate moved with it by the autopilot's
    rule for SGD (linear)."""

    batch: int
    lr: float
    warmup_examples: int = 0
    autopilot: bool = False
    half: float | None = None
    ramp_to: int = 0
    noise_budget: float | None = None  # the autopilot's noise-scale budget (None: bsmon's)

    @property
    def label(self) -> str:
        if self.autopilot:
            label = "auto, measured B½" if self.half is None else f"auto, B½={self.half:g} declared"
            return label if self.noise_budget is None else f"{label}, noise {self.noise_budget:g}"
        if self.ramp_to:
            return f"fastest ramp to {self.ramp_to}"
        if self.warmup_examples:
            return f"fixed {self.batch} + warm-up {self.warmup_examples // 1024}k ex"
        return f"fixed {self.batch}"


@dataclass
class RunLog:
    """What one run did. ``evals``: (examples, steps, training wall-clock s, held-out loss),
    the first at step 0; ``sizes``: each step's examples; ``lrs``: each step's learning rate
    (group 0, read before ``optimizer.step()``); ``monitor_sizes``: ``mon.batch_size`` after
    each step (autopilot only). The autopilot's reading at the end: its state, claimed gain,
    B½ and decisions."""

    evals: list[tuple[int, int, float, float]] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    monitor_sizes: list[int] = field(default_factory=list)
    diverged: bool = False
    stopped: str = ""
    claimed_gain: float | None = None  # at the end
    claimed_seen: float | None = None  # the latest claim read at an evaluation or the end
    claimed_note: str | None = None
    state: str | None = None
    why: str | None = None
    half_batch: float | None = None
    half_batch_how: str | None = None
    decisions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def examples(self) -> int:
        return sum(self.sizes)

    def first_reach(self, size: int) -> int | None:
        """Examples seen before the first step at a batch of ``size`` or more."""
        seen = 0
        for examples in self.sizes:
            if examples >= size:
                return seen
            seen += examples
        return None


def ramp_size(step: int, start: int, top: int) -> int:
    """The batch of the 0-based ``step`` on the fastest ramp from ``start`` to ``top`` that
    the autopilot's guards allow: ``start`` until its first decision (``WARMUP_STEPS``),
    then twice the size (its most per decision) every ``SETTLE_STEPS`` steps."""
    from bsmon.probes.batch.autopilot import SETTLE_STEPS, WARMUP_STEPS

    if step < WARMUP_STEPS:
        return start
    doublings = 1 + (step - WARMUP_STEPS) // SETTLE_STEPS
    return min(top, start << min(doublings, top.bit_length()))


class RampSampler:
    """Batches of indices in a seeded random order, each step's size from ``ramp_size``; the
    step count carries over from one epoch to the next (an epoch's last batch may be short,
    as a DataLoader's without ``drop_last``)."""

    def __init__(self, length: int, start: int, top: int, generator: torch.Generator) -> None:
        self.length, self.start, self.top, self.generator = length, start, top, generator
        self.steps = 0

    def __iter__(self) -> Iterator[list[int]]:
        order = torch.randperm(self.length, generator=self.generator).tolist()
        at = 0
        while at < self.length:
            size = ramp_size(self.steps, self.start, self.top)
            yield order[at : at + size]
            at += size
            self.steps += 1


def train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """One optimizer step on a batch, as the arms without a per-step schedule take it; the
    loss, for ``mon.log``."""
    loss = nn.functional.cross_entropy(model(inputs), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


@torch.no_grad()
def held_out_loss(model: nn.Module, data: Data) -> float:
    model.eval()
    inputs, labels = data.held_out
    loss = nn.functional.cross_entropy(model(inputs), labels).item()
    model.train()
    return loss


def train(
    task: Task,
    arm: Arm,
    seed: int,
    *,
    target: float,
    budget_examples: int,
    max_wall_s: float = 300.0,
) -> RunLog:
    """Train one arm from ``seed`` until the held-out loss is ≤ ``target`` (or the budget,
    a divergence or ``max_wall_s`` of training ends it)."""
    data = task.data()
    torch.manual_seed(seed)
    model = task.model()
    optimizer = torch.optim.SGD(model.parameters(), lr=arm.lr, momentum=0.9)
    order = torch.Generator().manual_seed(seed)
    mon = None
    if arm.autopilot:
        from bsmon.probes import attach

        mon = attach(
            model,
            optimizer,
            batch_size=arm.batch,
            autopilot=True,
            autopilot_half_batch=arm.half,
            max_batch_size=task.ceiling,
            record=False,
            serve=False,
            noise_scale="auto",
            name=f"autopilot-{task.name}-{seed}",
            **({} if arm.noise_budget is None else {"noise_budget": arm.noise_budget}),
        )
        loader: DataLoader = mon.dataloader(
            data.train, shuffle=True, generator=order, collate_fn=whole_batch
        )
    elif arm.ramp_to:
        sampler = RampSampler(len(data.train), arm.batch, arm.ramp_to, order)  # type: ignore[arg-type]
        loader = DataLoader(data.train, batch_sampler=sampler, collate_fn=whole_batch)
    else:
        loader = DataLoader(
            data.train, batch_size=arm.batch, shuffle=True, generator=order, collate_fn=whole_batch
        )
    log = RunLog()
    first = held_out_loss(model, data)
    log.evals.append((0, 0, 0.0, first))
    examples = steps = 0
    wall = 0.0
    next_eval = task.eval_every
    loss_fn = nn.functional.cross_entropy
    group = optimizer.param_groups[0]
    try:
        resumed = time.perf_counter()
        while not log.stopped:
            for inputs, labels in loader:
                count = len(labels)
                if arm.warmup_examples:
                    group["lr"] = arm.lr * min(1.0, (examples + count) / arm.warmup_examples)
                elif arm.ramp_to:
                    group["lr"] = arm.lr * ramp_size(steps, arm.batch, arm.ramp_to) / arm.batch
                loss = loss_fn(model(inputs), labels)
                optimizer.zero_grad()
                loss.backward()
                log.lrs.append(float(group["lr"]))
                optimizer.step()
                examples += count
                steps += 1
                log.sizes.append(count)
                if mon is not None:
                    mon.log(loss=loss)
                    log.monitor_sizes.append(int(mon.batch_size or 0))
                if examples < next_eval:
                    continue
                wall += time.perf_counter() - resumed
                while next_eval <= examples:
                    next_eval += task.eval_every
                value = held_out_loss(model, data)
                log.evals.append((examples, steps, wall, value))
                if mon is not None and (reading := mon.job.autopilot_reading()) is not None:
                    log.claimed_seen = reading.claimed_gain or log.claimed_seen
                if not math.isfinite(value) or value > DIVERGED_FACTOR * first:
                    log.diverged, log.stopped = True, "diverged"
                elif value <= target:
                    log.stopped = "target"
                elif examples >= budget_examples:
                    log.stopped = "budget"
                elif wall >= max_wall_s:
                    log.stopped = "wall-clock cap"
                if log.stopped:
                    break
                resumed = time.perf_counter()
    finally:
        if mon is not None:
            _read_autopilot(mon, log)
            mon.close()
    return log


def _read_autopilot(mon: Any, log: RunLog) -> None:
    reading = mon.job.autopilot_reading()
    if reading is None:
        log.state, log.why = "none", "the monitor has no autopilot (no batch size declared?)"
        return
    import msgspec

    log.claimed_gain = reading.claimed_gain
    log.claimed_seen = reading.claimed_gain or log.claimed_seen
    log.claimed_note = reading.claimed_note
    log.state, log.why = reading.state, reading.why
    log.half_batch, log.half_batch_how = reading.half_batch, reading.half_batch_how
    log.decisions = [msgspec.to_builtins(d) for d in reading.decisions]


# -- how far behind the live noise scale is ------------------------------------------------------


def exact_parts(
    model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor
) -> tuple[float, float]:
    """tr Σ and |G|² of the model as it is, from every example's own gradient
    (``torch.func``) over ``inputs``, both unbiased, in chunks of 256 examples."""
    from torch.func import functional_call, grad, vmap

    params = {name: p.detach() for name, p in model.named_parameters()}

    def loss_of(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(functional_call(model, p, (x[None],)), y[None])

    per_example = vmap(grad(loss_of), in_dims=(None, 0, 0))
    total: torch.Tensor | float = 0.0
    squares = 0.0
    for start in range(0, len(inputs), 256):
        grads = per_example(params, inputs[start : start + 256], labels[start : start + 256])
        flat = torch.cat([g.reshape(g.shape[0], -1) for g in grads.values()], 1).double()
        total = total + flat.sum(0)
        squares += float(flat.pow(2).sum())
    n = len(inputs)
    mean_sq = float((total / n).pow(2).sum())  # type: ignore[union-attr]
    trace = (squares - n * mean_sq) / (n - 1)
    return trace, mean_sq - trace / n


@dataclass(frozen=True)
class LagRow:
    """At a checkpoint step: the exact B_simple of the weights then (``point``), the exact
    ratio of the means of tr Σ and |G|² over ``WINDOW_POINTS`` weights evenly spread over the
    last ``AGE_SHARE`` of the steps so far (``window``: what averages reaching back that far
    would read, were every step measured), and the monitor's live estimate."""

    step: int
    point: float
    window: float
    live: float | None


WINDOW_POINTS = 8


def window_steps(checkpoint: int) -> list[int]:
    """The steps whose weights make a checkpoint's window: ``WINDOW_POINTS`` steps evenly
    spread over the last quarter of the run (the noise scale's young-run horizon), ending at
    the checkpoint."""
    from bsmon.probes.noise.smoothing import AGE_SHARE

    span = AGE_SHARE * checkpoint
    return sorted(
        {max(1, round(checkpoint - span * k / WINDOW_POINTS)) for k in range(WINDOW_POINTS)}
    )


def noise_lag(
    task: Task, batch: int, lr: float, seed: int, checkpoints: list[int], examples: int = 16_384
) -> list[LagRow]:
    """Train ``batch`` fixed under bsmon (its noise scale at the defaults) and, at each
    checkpoint step, a ``LagRow``: the exact values on ``examples`` training examples (a fixed
    draw: with φ near their count the estimate of |G|² is noisy)."""
    from bsmon.probes import attach

    data = task.data()
    draw = torch.Generator().manual_seed(DATA_SEED)
    probe = DataLoader(
        data.train, batch_size=examples, shuffle=True, generator=draw, collate_fn=whole_batch
    )
    probe_inputs, probe_labels = next(iter(probe))
    torch.manual_seed(seed)
    model = task.model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    mon = attach(model, optimizer, batch_size=batch, record=False, serve=False)
    order = torch.Generator().manual_seed(seed)
    loader = mon.dataloader(data.train, shuffle=True, generator=order, collate_fn=whole_batch)
    wanted = {step for checkpoint in checkpoints for step in window_steps(checkpoint)}
    weights: dict[int, dict[str, torch.Tensor]] = {}
    live: dict[int, float | None] = {}
    try:
        while mon.step < max(checkpoints):
            for inputs, labels in loader:
                mon.log(loss=train_step(model, optimizer, inputs, labels))
                if mon.step in wanted:
                    weights[mon.step] = {
                        k: v.detach().clone() for k, v in model.state_dict().items()
                    }
                if mon.step in checkpoints:
                    mon.flush()
                    live[mon.step] = mon.noise_scale
                if mon.step >= max(checkpoints):
                    break
    finally:
        mon.close()
    # the exact values come afterwards, on a twin: run on the monitored model, every
    # example's forward would pass through bsmon's hooks, and minutes between two steps
    # would read as one step's time
    twin = task.model()
    parts = {}
    for step, state in sorted(weights.items()):
        twin.load_state_dict(state)
        parts[step] = exact_parts(twin, probe_inputs, probe_labels)
    rows = []
    for checkpoint in checkpoints:
        trace, g2 = parts[checkpoint]
        window = [parts[step] for step in window_steps(checkpoint)]
        mean_trace = statistics.fmean(t for t, _ in window)
        mean_g2 = statistics.fmean(g for _, g in window)
        rows.append(LagRow(checkpoint, trace / g2, mean_trace / mean_g2, live[checkpoint]))
    return rows


# -- this machine's step time ----------------------------------------------------------------


def step_times(
    task: Task, sizes: list[int], *, seconds: float = 0.4, repeats: int = 3
) -> dict[int, float]:
    """This machine's time per training step (data, forward, backward, SGD step) at each
    batch size: the fastest of ``repeats`` timings of about ``seconds`` each, after a warm-up."""
    data = task.data()
    torch.manual_seed(0)
    model = task.model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    result = {}
    for size in sizes:
        loader = DataLoader(
            data.train,
            batch_size=size,
            shuffle=True,
            drop_last=True,
            generator=torch.Generator().manual_seed(0),
            collate_fn=whole_batch,
        )
        batches = iter(loader)

        def one_step(loader: DataLoader = loader) -> None:
            nonlocal batches
            try:
                inputs, labels = next(batches)
            except StopIteration:
                batches = iter(loader)
                inputs, labels = next(batches)
            train_step(model, optimizer, inputs, labels)

        for _ in range(10):
            one_step()
        started = time.perf_counter()
        one_step()
        count = max(5, int(seconds / max(time.perf_counter() - started, 1e-6)))
        timings = []
        for _ in range(repeats):
            started = time.perf_counter()
            for _ in range(count):
                one_step()
            timings.append((time.perf_counter() - started) / count)
        result[size] = min(timings)
        print(
            f"  [{task.name}] t({size}) = {result[size] * 1e3:.3f} ms "
            f"(spread {statistics.pstdev(timings) / result[size]:.0%})",
            file=sys.stderr,
        )
    return result


COST_CONFIGS = {
    "bsmon, noise scale off": {"noise_scale": None},
    "bsmon, noise scale on its budget": {},
    "bsmon, noise scale + autopilot": {"autopilot": True},
}


@dataclass
class CostRounds:
    """``autopilot_cost``'s measurements: each configuration's mean step time per round (the
    same rounds for every configuration, so they pair), and per round the agent thread's CPU
    time in the autopilot's looks over the round's wall time."""

    step_s: dict[str, list[float]]
    looks_share: list[float]


class LookClock:
    """The CPU time the agent thread spends in ``Autopilot.on_metrics`` (its looks), summed
    while installed."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __enter__(self) -> LookClock:
        from bsmon.probes.batch.autopilot import Autopilot

        self._original = original = Autopilot.on_metrics
        clock = self

        def timed(autopilot: Any, metrics: Any) -> None:
            began = time.thread_time()
            try:
                original(autopilot, metrics)
            finally:
                clock.seconds += time.thread_time() - began

        Autopilot.on_metrics = timed  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        from bsmon.probes.batch.autopilot import Autopilot

        Autopilot.on_metrics = self._original  # type: ignore[method-assign]


class CostJob:
    """One configuration's training job: its own model, optimizer, monitor and batches."""

    def __init__(self, task: Task, size: int, config: dict[str, Any]) -> None:
        from bsmon.probes import attach

        torch.manual_seed(0)
        self.model = task.model()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-4, momentum=0.9)
        options = {"record": False, "serve": False, "max_batch_size": size}
        self.mon = attach(self.model, self.optimizer, batch_size=size, **options, **config)
        self._loader = self.mon.dataloader(task.data().train, shuffle=True, collate_fn=whole_batch)
        self._batches = iter(self._loader)

    def run(self, steps: int) -> float:
        """``steps`` training steps; their wall time."""
        started = time.perf_counter()
        for _ in range(steps):
            try:
                inputs, labels = next(self._batches)
            except StopIteration:
                self._batches = iter(self._loader)
                inputs, labels = next(self._batches)
            self.mon.log(loss=train_step(self.model, self.optimizer, inputs, labels))
        return time.perf_counter() - started


def autopilot_cost(
    task: Task,
    size: int,
    *,
    rounds: int = 12,
    turns: int = 10,
    block: int = 100,
    warmup: int = 1500,
) -> CostRounds:
    """The autopilot's own cost, its estimate (the noise scale on its budget) and its
    decisions together: the mean step time at a fixed ``size`` under bsmon with the noise
    scale off, with it on, and with it on and the autopilot steering (held at ``size`` by
    ``max_batch_size``, so every look decides to stay). The three jobs live in one process
    and take turns, ``block`` steps at a time in an order rotated every turn, so that the
    machine's drift (here ±20% between fresh jobs a few seconds apart) falls on the three
    alike; a round is ``turns`` turns, after ``warmup`` steps each (the noise scale's warm-up
    and the autopilot's fast-paced first looks are then over)."""
    names = list(COST_CONFIGS)
    result = CostRounds({name: [] for name in names}, [])
    with LookClock() as looks:
        jobs = {name: CostJob(task, size, COST_CONFIGS[name]) for name in names}
        try:
            for _ in range(warmup // block):
                for job in jobs.values():
                    job.run(block)
            for round_ in range(rounds):
                spent = dict.fromkeys(names, 0.0)
                looked, began = looks.seconds, time.perf_counter()
                for turn in range(turns):
                    shift = (round_ * turns + turn) % len(names)
                    for name in names[shift:] + names[:shift]:
                        spent[name] += jobs[name].run(block)
                result.looks_share.append((looks.seconds - looked) / (time.perf_counter() - began))
                for name in names:
                    result.step_s[name].append(spent[name] / (turns * block))
                shown = ", ".join(f"{result.step_s[n][-1] * 1e3:.3f}" for n in names)
                print(f"  [{task.name}] cost round {round_}: {shown} ms", file=sys.stderr)
        finally:
            for job in jobs.values():
                job.mon.close()
    return result
