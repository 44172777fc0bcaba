"""The moving targets of benchmarks/noise_tracking.py: T1 and T2 of the autopilot benchmark
(their data, models and SGD settings, the learning rate moved to the batch by their linear
rule) and the small transformer of ``transformer.py`` with AdamW; for each, a job that
trains at a fixed batch and the fixed set of training examples the exact value is taken on."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache

import torch
from autopilot_kit.tasks import DATA_SEED, TASKS, Pairs, whole_batch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from . import transformer

Batch = tuple[torch.Tensor, torch.Tensor]
Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Job:
    """One run's model, optimizer and endless stream of batches; ``loss``: the job's mean loss
    over a batch, which is also each example's loss given a batch of one."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    batches: Iterator[Batch]
    loss: Loss


@dataclass(frozen=True)
class TrackingTask:
    name: str
    title: str
    data: Callable[[], Dataset]
    model: Callable[[], nn.Module]
    optimizer: Callable[[nn.Module, int], torch.optim.Optimizer]  # (model, batch)
    loss: Loss
    # the exact value's fixed set: enough examples that its own error (a jackknife) stays
    # near 5% — over 2,048, T1's and T2's read ±8–43%, as wide as the goals' band
    examples: int = 2048

    def job(self, seed: int, batch: int) -> Job:
        """The model's initial weights and the order of the examples from ``seed``."""
        torch.manual_seed(seed)
        model = self.model()
        loader = DataLoader(
            self.data(),
            batch_size=batch,
            shuffle=True,
            drop_last=True,
            generator=torch.Generator().manual_seed(seed),
            collate_fn=whole_batch,
        )
        return Job(model, self.optimizer(model, batch), _endless(loader), self.loss)

    def fixed_set(self, examples: int) -> Batch:
        """``examples`` training examples drawn once (from ``DATA_SEED``, whatever the run)."""
        data = self.data()
        draw = torch.Generator().manual_seed(DATA_SEED)
        rows = torch.randperm(len(data), generator=draw)[:examples]  # type: ignore[arg-type]
        return data.__getitems__(rows.tolist())  # type: ignore[attr-defined]


def _endless(loader: DataLoader) -> Iterator[Batch]:
    while True:
        yield from loader


def _sgd_linear(name: str) -> Callable[[nn.Module, int], torch.optim.Optimizer]:
    """The autopilot task's SGD (momentum 0.9), its start batch's tuned rate moved linearly."""
    task = TASKS[name]

    def build(model: nn.Module, batch: int) -> torch.optim.Optimizer:
        lr = task.lr_centre[task.start_batch] * batch / task.start_batch
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)

    return build


def _adamw(model: nn.Module, batch: int) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


@cache
def _sequences() -> Dataset:
    sequences = transformer.markov_sequences()
    return Pairs(sequences[:, :-1], sequences[:, 1:])


def _autopilot_task(key: str, name: str, title: str) -> TrackingTask:
    task = TASKS[key]
    return TrackingTask(
        name,
        f"{title}: {task.title}",
        lambda: task.data().train,
        task.model,
        _sgd_linear(key),
        nn.functional.cross_entropy,
        examples=16_384,
    )


TRACKING_TASKS = {
    "T1": _autopilot_task("synthetic", "T1", "T1"),
    "T2": _autopilot_task("charlm", "T2", "T2"),
    "transformer": TrackingTask(
        "transformer",
        "transformer: decoder 2×64, 4 heads, context 32, order-2 Markov language, AdamW 1e-3",
        _sequences,
        transformer.Decoder,
        _adamw,
        transformer.sequence_loss,
    ),
}
