"""The batch size of a DataLoader the script built itself, changed from outside (``bsmon run
--resizable``).

Nothing is touched until a change is asked for: until then the job draws exactly the batches,
in exactly the order, it would without bsmon. A change, at a step boundary, sets the loader's
``BatchSampler.batch_size`` (the next epochs, ``len(loader)``, ``loader.batch_size``) and
takes over the running epoch's cutting from the same iterator over the sampler's indices, so
the rest of the epoch is cut at the new size with no sample dropped or repeated. Batches that
DataLoader workers already prefetched keep their size; the event says how many. A change asked
when the running epoch has no batch left to cut (between epochs, while the script evaluates or
saves; or once its workers prefetched the whole epoch) waits for the next epoch: it is applied
as the loader starts cutting it, so that epoch runs at the new size from its first batch.

What cannot be resized is refused with the reason: a custom batch sampler, an
``IterableDataset`` (its batches are cut inside its workers), a loader without automatic
batching. A size that leaves a last batch of one sample in a model with BatchNorm (which
cannot train on it), and a smaller batch under a ``OneCycleLR`` (which raises once stepped
past its ``total_steps``), are refused too.
"""

from __future__ import annotations

import gc
import inspect
import itertools
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from ..runtime import loader_watch
from ..runtime.call_watch import CallWatch
from ..wire.protocol import Event

TrainingIterator = Callable[[], Any]  # the DataLoader iterator of the job's training batches


NEXT_EPOCH = "from the next epoch's first batch"
NO_LOADER = "no training batch from a DataLoader was seen"


def why_not_resizable(iterator: Any) -> str | None:
    """Why the loader behind ``iterator`` cannot be resized (None: it can)."""
    if iterator is None:
        return NO_LOADER
    if isinstance(getattr(iterator, "_dataset", None), IterableDataset):
        return "the training data is an IterableDataset: its batches are cut inside its iterator"
    if not getattr(iterator, "_auto_collation", False):
        return "the training DataLoader has batch_size=None: the script's dataset makes batches"
    sampler = getattr(iterator, "_index_sampler", None)
    if type(sampler) is not BatchSampler:
        return (
            f"the training DataLoader cuts batches with its own batch_sampler "
            f"({type(sampler).__name__}), which bsmon cannot resize"
        )
    return None


def _indices_of(iterator: Any) -> Iterator[int] | None:
    """The iterator over the sampler's indices inside the running epoch's BatchSampler
    generator (a suspended generator's locals), or None."""
    cutting = getattr(iterator, "_sampler_iter", None)
    frame = getattr(cutting, "gi_frame", None)
    code = getattr(cutting, "gi_code", None)
    if frame is None:
        return None
    if code is _batch_sampler_code():
        return frame.f_locals.get("sampler_iter")
    if code is cut.__code__:  # resized before in this epoch: cut by bsmon already
        return frame.f_locals.get("indices")
    return None


def _batch_sampler_code() -> Any:
    """The code of torch's ``BatchSampler.__iter__`` (under bsmon's watch of it, if any)."""
    return inspect.unwrap(BatchSampler.__iter__).__code__


def why_next_epoch(iterator: Any) -> str | None:
    """Why a change must wait for the next epoch: the running epoch (``iterator``'s; None:
    between epochs) has no batch left for bsmon to cut. None: it can be cut now."""
    if iterator is None:
        return "between epochs"
    cutting = getattr(iterator, "_sampler_iter", None)
    state = inspect.getgeneratorstate(cutting) if inspect.isgenerator(cutting) else None
    if state == inspect.GEN_CREATED or _indices_of(iterator) is not None:
        return None
    if state == inspect.GEN_CLOSED:
        if _prefetched(iterator):
            return "its workers already prefetched the rest of this epoch"
        return "this epoch's batches are all drawn"
    return "bsmon cannot re-cut this torch's running epoch"


def _prefetched(iterator: Any) -> int:
    """Batches cut for DataLoader workers and not yet handed to the script: asked of a worker,
    or back from one ahead of their turn (which ``_tasks_outstanding`` no longer counts)."""
    sent, handed = getattr(iterator, "_send_idx", 0), getattr(iterator, "_rcvd_idx", 0)
    ahead = sent - handed if isinstance(sent, int) and isinstance(handed, int) else 0
    return max(ahead, 0)


def cut(indices: Iterator[int], size: Callable[[], int], drop_last: bool) -> Iterator[list[int]]:
    """What ``BatchSampler`` yields, with the size read before each batch."""
    while True:
        wanted = size()
        batch = list(itertools.islice(indices, wanted))
        if not batch or (drop_last and len(batch) < wanted):
            return
        yield batch


def _len_locate() -> tuple[Any, str]:
    return DataLoader, "__len__"


class LengthReads:
    """The lengths the script read from its DataLoaders (``len(loader)``: progress bars,
    schedules sized in steps), so a change can say what they no longer match."""

    def __init__(self) -> None:
        self._watch = CallWatch(_len_locate)
        self.read: dict[int, int] = {}  # id(batch sampler) -> the last length read

    def start(self) -> str | None:
        return self._watch.subscribe(self._on_len)

    def stop(self) -> None:
        self._watch.unsubscribe(self._on_len)

    def _on_len(self, loader: Any, length: Any, _started: float, _finished: float) -> None:
        if isinstance(length, int):
            self.read[id(getattr(loader, "batch_sampler", None))] = length


class ScriptLoader:
    """Batch control's hands on the script's own training DataLoader."""

    def __init__(
        self, training_iterator: TrainingIterator, model: nn.Module | None, scheduler: Any
    ) -> None:
        self._iterator = training_iterator
        self._sampler: Callable[[], BatchSampler | None] = lambda: None  # weak, kept between epochs
        self._has_batch_norm = model is not None and any(
            isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()
        )
        self._scheduler = scheduler
        self.lengths = LengthReads()
        self.epoch_starts: Callable[[], None] = lambda: None  # a change waiting is applied here
        self._epochs = CallWatch(_epochs_locate)
        self._starting = False  # inside the training sampler's start of an epoch

    def remember(self, iterator: Any) -> None:
        """The training loader behind ``iterator``: its BatchSampler is the one resized, also
        between epochs, once the iterator is gone."""
        if why_not_resizable(iterator) is None:
            self._sampler = weakref.ref(iterator._index_sampler)

    def _batch_sampler(self, iterator: Any) -> BatchSampler | None:
        return iterator._index_sampler if iterator is not None else self._sampler()

    def refusal(self, value: int) -> str | None:
        """Why ``value`` cannot be applied (agent thread; None: it can)."""
        iterator = self._iterator()
        if iterator is not None and (why := why_not_resizable(iterator)) is not None:
            return why
        sampler = self._batch_sampler(iterator)
        if sampler is None:
            return NO_LOADER
        size = sampler.batch_size
        samples = _length(sampler.sampler)
        if self._has_batch_norm and not sampler.drop_last and samples and samples % value == 1:
            return (
                f"{value} leaves a last batch of 1 sample in each epoch ({samples:,} samples), "
                "which the model's BatchNorm cannot train on"
            )
        if value < size and isinstance(self._scheduler, torch.optim.lr_scheduler.OneCycleLR):
            total = getattr(self._scheduler, "total_steps", None)
            return (
                f"the script's OneCycleLR raises once stepped past its total_steps ({total}): "
                f"a batch below {size} needs more steps than it allows"
            )
        return None

    def waits_for(self) -> str | None:
        """Where a change asked now is applied when the running epoch has no batch left to cut
        (agent thread): at the training loader's next epoch, watched from now on. None: at the
        next step boundary."""
        why = why_next_epoch(self._iterator())
        if why is None:
            return None
        self._epochs.subscribe(self._on_epoch)
        return f"{NEXT_EPOCH} ({why})"

    def _on_epoch(self, sampler: Any, _cutting: Any, _started: float, _finished: float) -> None:
        """A BatchSampler starts an epoch (training thread, before its first batch is cut):
        the training loader's applies the change that waits for it."""
        if sampler is not self._sampler():
            return
        self._epochs.unsubscribe(self._on_epoch)
        self._starting = True
        try:
            self.epoch_starts()
        finally:
            self._starting = False

    def stop(self) -> None:
        self._epochs.unsubscribe(self._on_epoch)

    def resize(self, new: int) -> str:
        """Apply ``new`` (training thread, at the step boundary); where it takes effect."""
        iterator = self._iterator()
        sampler = self._batch_sampler(iterator)
        if sampler is None:  # the loader is gone: nothing left to resize
            return "from the next DataLoader the script builds, if it is resizable"
        sampler.batch_size = new
        for holder in gc.get_referrers(sampler):  # the DataLoader's own batch_size attribute
            if isinstance(holder, DataLoader) and holder.batch_sampler is sampler:
                object.__setattr__(holder, "batch_size", new)  # it refuses a plain setattr
        words = [self._where(iterator, sampler)]
        read = self.lengths.read.get(id(sampler))
        if read is not None:
            words.append(
                f"the script read len(loader) = {read:,} before: a progress bar or a schedule "
                f"sized from it still counts that many batches (now {len(sampler):,} an epoch)"
            )
        return "; ".join(words)

    def _where(self, iterator: Any, sampler: BatchSampler) -> str:
        """Where the new size takes effect; the running epoch re-cut at it, if it can be."""
        if self._starting:
            return "from the first batch of the epoch it starts now"
        if (why := why_next_epoch(iterator)) is not None:
            return f"{NEXT_EPOCH} ({why})"
        indices = _indices_of(iterator)
        if indices is not None:
            iterator._sampler_iter = cut(indices, lambda: sampler.batch_size, sampler.drop_last)
        if ahead := _prefetched(iterator):
            return f"after the {ahead} batches its workers already prefetched"
        return "from the next batch"


def _epochs_locate() -> tuple[Any, str]:
    return BatchSampler, "__iter__"


def _length(sampler: Any) -> int | None:
    try:
        return len(sampler)
    except TypeError:
        return None


FRAMEWORKS = {  # a trainer class's module -> how its batch size is changed instead
    "transformers.trainer": (
        "the Hugging Face Trainer counts its steps from its DataLoader's length once; "
        "bsmon's Trainer callback changes its batch size (docs/integrations.md)"
    ),
    "lightning.pytorch.trainer.trainer": (
        "Lightning's loop counts an epoch's batches from its DataLoader's length; "
        "bsmon's Lightning callback changes its batch size (docs/integrations.md)"
    ),
}
FRAMEWORKS["pytorch_lightning.trainer.trainer"] = FRAMEWORKS["lightning.pytorch.trainer.trainer"]


def framework_reason(objects: list[Any]) -> str | None:
    """Why a framework's own loop rules out resizing its loader (None: no such trainer)."""
    for obj in objects:
        why = FRAMEWORKS.get(getattr(type(obj), "__module__", ""))
        if why is not None and type(obj).__name__ == "Trainer":
            return why
    return None


def find_scheduler(optimizer: torch.optim.Optimizer, objects: list[Any]) -> Any:
    """The job's one learning-rate scheduler of ``optimizer`` (None: none, or several)."""
    base = getattr(torch.optim.lr_scheduler, "LRScheduler", None)
    if base is None:
        return None
    found = [
        obj
        for obj in objects
        if issubclass(type(obj), base) and getattr(obj, "optimizer", None) is optimizer
    ]
    return found[0] if len(found) == 1 else None


def take_control(
    monitor: Any,
    model: nn.Module | None,
    scheduler: Any,
    first_iterator: TrainingIterator,
    lengths: LengthReads | None,
) -> ScriptLoader:
    """Batch control over the script's own DataLoader: the monitor's batch control (made with
    the loader's batch size) vetoes what the loader cannot take and resizes it at the switch;
    ``first_iterator``: the loader's iterator until the monitor has seen one itself."""
    loader = ScriptLoader(
        lambda: monitor.job.training_iterator() or first_iterator(), model, scheduler
    )
    if lengths is not None:
        loader.lengths = lengths
    control = monitor.job.batch_control
    monitor.job.veto_batch_sizes(loader.refusal)

    def epoch_starts() -> None:  # inside torch's BatchSampler.__iter__: report, never raise
        try:
            control.apply_deferred()
        except Exception as exc:
            monitor.job.report_error("a batch size applied at an epoch's start", exc)

    if not control.synced:  # ranks agree on the step a change applies at: left to that
        control.wait_for = loader.waits_for
        loader.epoch_starts = epoch_starts
    if (first := first_iterator()) is not None:
        loader.remember(first)

    def resized(_old: int, new: int) -> None:
        where = loader.resize(new)
        message = f"the script's DataLoader cuts batches of {new} {where}"
        monitor.job.emit(Event(t=time.time(), step=monitor.step, kind="zero_code", message=message))

    def new_epoch(iterator: Any) -> None:  # a DataLoader built anew gets the size too
        loader.remember(iterator)
        if control.waiting:  # for an epoch of the loader before: this one's second batch
            control.apply_deferred()
        stale = loader_watch.nominal_batch_size(iterator) not in (None, control.size)
        if stale and why_not_resizable(iterator) is None:
            loader.resize(control.size)

    monitor.on_batch_size_change(resized)
    monitor.job.on_training_iterator(new_epoch)
    return loader
