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

import contextlib
import functools
import threading
import time
from collections.abc import Callable
from typing import Any

OnBatch = Callable[[Any, Any, float, float], None]  # (iterator, batch or None, start, end)

_lock = threading.Lock()
_subscribers: list[OnBatch] = []
_installed: dict[str, Any] = {}  # "class", "original", "wrapper" while installed


def subscribe(callback: OnBatch) -> str | None:
    """Call ``callback`` after every DataLoader batch; None, or why batches cannot be seen."""
    with _lock:
        if not _installed:
            why = _install()
            if why is not None:
                return why
        if callback not in _subscribers:
            _subscribers.append(callback)
    return None


def unsubscribe(callback: OnBatch) -> None:
    with _lock:
        if callback in _subscribers:
            _subscribers.remove(callback)
        if not _subscribers and _installed:
            _uninstall()


def _install() -> str | None:
    from torch.utils.data import dataloader

    iterator_class = getattr(dataloader, "_BaseDataLoaderIter", None)
    original = getattr(iterator_class, "__next__", None)
    if iterator_class is None or original is None:
        return "this torch has no _BaseDataLoaderIter: DataLoader batches are not seen"

    @functools.wraps(original)
    def __next__(iterator: Any) -> Any:
        started = time.perf_counter()
        try:
            batch = original(iterator)
        except StopIteration:
            _notify(iterator, None, started)
            raise
        _notify(iterator, batch, started)
        return batch

    iterator_class.__next__ = __next__  # type: ignore[method-assign]
    _installed.update({"class": iterator_class, "original": original, "wrapper": __next__})
    return None


def _uninstall() -> None:
    iterator_class = _installed["class"]
    if iterator_class.__dict__.get("__next__") is _installed["wrapper"]:
        iterator_class.__next__ = _installed["original"]
    _installed.clear()


def _notify(iterator: Any, batch: Any, started: float) -> None:
    finished = time.perf_counter()
    for callback in tuple(_subscribers):
        # a subscriber reports its own errors; the loader must never see one
        with contextlib.suppress(Exception):
            callback(iterator, batch, started, finished)


def nominal_batch_size(iterator: Any) -> int | None:
    """The batch size the iterator's loader was built with (its batch sampler's), if any."""
    sampler = getattr(iterator, "_index_sampler", None)
    size = getattr(sampler, "batch_size", None)
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None
