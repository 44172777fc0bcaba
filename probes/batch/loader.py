"""A DataLoader whose batch size follows the monitor, batch by batch.

``DynamicBatchSampler`` draws indices from one iterator over the base sampler and asks for
the current batch size before cutting each batch, so a change mid-epoch neither drops nor
repeats a sample. Batches already prefetched by workers keep the size they were cut with.

Indices can be handed back (``requeue``): the OOM guard does this so that the samples of a
batch that ran out of memory are cut again, at the smaller size, before any new ones.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler, Sampler, SequentialSampler

_OWN_ARGUMENTS = ("batch_size", "batch_sampler")


class DynamicBatchSampler(Sampler[list[int]]):
    def __init__(
        self,
        sampler: Sampler[int] | Sized,
        batch_size: Callable[[], int],
        drop_last: bool = False,
    ) -> None:
        self.sampler = sampler
        self._batch_size = batch_size
        self.drop_last = drop_last
        self.requeued: deque[int] = deque()
        self.cut: deque[list[int]] = deque()  # batches handed out and not yet yielded

    def requeue(self, indices: list[int]) -> None:
        """Serve ``indices`` again, first, in batches of the size current when they are cut."""
        self.requeued.extendleft(reversed(indices))

    def current_size(self) -> int:
        return max(1, int(self._batch_size()))

    def take(self, source: Iterator[int], size: int) -> list[int]:
        batch: list[int] = []
        while self.requeued and len(batch) < size:
            batch.append(self.requeued.popleft())
        if len(batch) < size:  # never pull an index from ``source`` that will not be used
            for index in source:
                batch.append(index)
                if len(batch) == size:
                    break
        return batch

    def __iter__(self) -> Iterator[list[int]]:
        self.cut.clear()
        indices = iter(self.sampler)
        while True:
            size = self.current_size()
            batch = self.take(indices, size)
            if not batch or (self.drop_last and len(batch) < size):
                return
            self.cut.append(batch)
            yield batch

    def __len__(self) -> int:
        """Batches in an epoch at the current size (the size may change during the epoch)."""
        size = self.current_size()
        total = len(self.sampler) + len(self.requeued)  # type: ignore[arg-type]
        return total // size if self.drop_last else math.ceil(total / size)


def batch_length(batch: Any) -> int | None:
    """Samples in a collated batch: dim 0 of its first tensor (in a tuple, list, dict or any
    mapping), else the length of a list."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else None
    if isinstance(batch, dict):
        for value in batch.values():
            if (n := batch_length(value)) is not None:
                return n
        return None
    if isinstance(batch, (list, tuple)) and batch:
        if (n := batch_length(batch[0])) is not None:
            return n
        return len(batch)
    if isinstance(batch, Mapping):  # a UserDict: Hugging Face's BatchEncoding
        return batch_length(dict(batch))
    return None


class NominalBatch:
    """The job's batch size as a person would state it, from the batches its steps drew: a
    new size takes over once two steps in a row have it, so the short last batch of an epoch
    is not a change of batch size (its samples still count as drawn).

    A job whose count changes every step (an episode per step, as long as the episode) has
    no one size: once a new count is followed by a third one, not the size it replaced, the
    size *varies* — ``update`` returns None (no one number for the step), ``last`` is the
    latest count and ``range`` the least and most of the last ``VARY_WINDOW`` — until
    ``SETTLE_AFTER`` steps in a row have the same count again."""

    VARY_WINDOW = 32
    SETTLE_AFTER = 4

    def __init__(self) -> None:
        self.size: int | None = None
        self.candidate: int | None = None  # a new size seen once, not yet twice in a row
        self.last: int | None = None  # the latest count
        self.recent: deque[int] = deque(maxlen=self.VARY_WINDOW)  # while varying
        self.repeats = 0  # steps in a row with the latest count, while varying

    @property
    def varies(self) -> bool:
        return bool(self.recent)

    @property
    def range(self) -> tuple[int, int] | None:
        """The least and most of the recent counts while the size varies, else None."""
        return (min(self.recent), max(self.recent)) if self.recent else None

    def update(self, observed: int | None) -> int | None:
        if self.recent:
            return self._varying(observed)
        if observed is None or observed == self.size:
            self.candidate = None
        elif self.size is None or observed == self.candidate:
            self.size, self.candidate = observed, None
        elif self.candidate is not None:  # a third count before the second was confirmed
            self.recent.extend((self.size, self.candidate, observed))
            self.size = self.candidate = None
            self.repeats = 1
        else:
            self.candidate = observed
        self.last = observed if observed is not None else self.last
        return self.size

    def _varying(self, observed: int | None) -> int | None:
        if observed is None:
            return None
        self.repeats = self.repeats + 1 if observed == self.last else 1
        self.last = observed
        self.recent.append(observed)
        if self.repeats >= self.SETTLE_AFTER:
            self.recent.clear()
            self.size = observed
        return self.size


OnBatch = Callable[["MonitoredDataLoader", Any, list[int]], None]


class MonitoredDataLoader(DataLoader):
    """A DataLoader that reports every batch it yields (and its indices) to the monitor."""

    def __init__(self, *args: Any, on_batch: OnBatch, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_batch = on_batch

    @property
    def dynamic_sampler(self) -> DynamicBatchSampler:
        return self.batch_sampler  # type: ignore[return-value]

    def requeue(self, indices: list[int]) -> None:
        self.dynamic_sampler.requeue(indices)

    def __iter__(self) -> Iterator[Any]:
        sampler = self.dynamic_sampler
        for batch in super().__iter__():
            indices = sampler.cut.popleft() if sampler.cut else []
            self._on_batch(self, batch, indices)
            yield batch
        # Indices requeued after the sampler had already finished cutting (a worker
        # prefetched the epoch's end): fetch them here so no sample is lost this epoch.
        while sampler.requeued:
            indices = sampler.take(iter(()), sampler.current_size())
            batch = self.collate_fn([self.dataset[i] for i in indices])  # type: ignore[index]
            self._on_batch(self, batch, indices)
            yield batch


def make_dataloader(
    dataset: Dataset,
    current_batch_size: Callable[[], int],
    on_batch: OnBatch,
    **kwargs: Any,
) -> MonitoredDataLoader:
    """Build the loader behind ``Monitor.dataloader``; DataLoader keywords pass through."""
    for name in _OWN_ARGUMENTS:
        if name in kwargs:
            raise ValueError(
                f"mon.dataloader() sets {name} itself from mon.batch_size; "
                "remove it (pass sampler= to choose the order of samples)"
            )
    shuffle = kwargs.pop("shuffle", False)
    sampler = kwargs.pop("sampler", None)
    drop_last = bool(kwargs.pop("drop_last", False))
    if sampler is not None and shuffle:
        raise ValueError("mon.dataloader(): pass either sampler= or shuffle=True, not both")
    if sampler is None:
        generator = kwargs.get("generator")
        sampler = (
            RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
        )
    batch_sampler = DynamicBatchSampler(sampler, current_batch_size, drop_last=drop_last)
    return MonitoredDataLoader(dataset, batch_sampler=batch_sampler, on_batch=on_batch, **kwargs)
