"""A DataLoader whose batch size follows the monitor, batch by batch.

``DynamicBatchSampler`` draws indices from one iterator over the base sampler and asks for
the current batch size before cutting each batch, so a change mid-epoch neither drops nor
repeats a sample. Batches already prefetched by workers keep the size they were cut with.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sized
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

    def __iter__(self) -> Iterator[list[int]]:
        indices = iter(self.sampler)
        while True:
            size = max(1, int(self._batch_size()))
            batch: list[int] = []
            for index in indices:
                batch.append(index)
                if len(batch) == size:
                    break
            if not batch or (self.drop_last and len(batch) < size):
                return
            yield batch

    def __len__(self) -> int:
        """Batches in an epoch at the current size (the size may change during the epoch)."""
        size = max(1, int(self._batch_size()))
        total = len(self.sampler)  # type: ignore[arg-type]
        return total // size if self.drop_last else math.ceil(total / size)


def batch_length(batch: Any) -> int | None:
    """Samples in a collated batch: dim 0 of its first tensor, else the length of a list."""
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
    return None


class MonitoredDataLoader(DataLoader):
    """A DataLoader that reports every batch it yields to the monitor."""

    def __init__(self, *args: Any, on_batch: Callable[[Any], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_batch = on_batch

    def __iter__(self) -> Iterator[Any]:
        for batch in super().__iter__():
            self._on_batch(batch)
            yield batch


def make_dataloader(
    dataset: Dataset,
    current_batch_size: Callable[[], int],
    on_batch: Callable[[Any], None],
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
