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
