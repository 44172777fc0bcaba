"""Every DataLoader's batches, seen by wrapping ``_BaseDataLoaderIter.__next__`` once.

bsmon run counts the samples of scripts it did not change this way, and every monitor learns
from it when the job draws training batches and when it runs an evaluation loop (batches
drawn with gradients off, or while the model is in ``eval()`` mode), so that evaluation time
is not taken for step time. One wrapper serves the whole process; it is removed when the last
subscriber leaves (and this module's wrapper is still the one installed).

A subscriber is called on the thread that iterates, after each ``__next__``, with the
iterator, the batch (``None`` when the iterator is exhausted) and the call's start and end
(``time.perf_counter``). Subscribers must do O(1) work and never raise; the wrapper catches
what they raise anyway, so a DataLoader never fails because of bsmon.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .call_watch import CallWatch

OnBatch = Callable[[Any, Any, float, float], None]  # (iterator, batch or None, start, end)


def _locate() -> tuple[Any, str] | str:
    from torch.utils.data import dataloader

    iterator_class = getattr(dataloader, "_BaseDataLoaderIter", None)
    if iterator_class is None or getattr(iterator_class, "__next__", None) is None:
        return "this torch has no _BaseDataLoaderIter: DataLoader batches are not seen"
    return iterator_class, "__next__"


_watch = CallWatch(_locate, notify_on=(StopIteration,))


def subscribe(callback: OnBatch) -> str | None:
    """Call ``callback`` after every DataLoader batch; None, or why batches cannot be seen."""
    return _watch.subscribe(callback)


def unsubscribe(callback: OnBatch) -> None:
    _watch.unsubscribe(callback)


def nominal_batch_size(iterator: Any) -> int | None:
    """The batch size the iterator's loader was built with (its batch sampler's), if any."""
    sampler = getattr(iterator, "_index_sampler", None)
    size = getattr(sampler, "batch_size", None)
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None
