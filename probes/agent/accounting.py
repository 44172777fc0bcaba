"""What the job's own signals say about a step, on the training thread: a DataLoader's batch
(training or evaluation, and the samples it holds), ``model.train()``/``model.eval()`` (the
evaluation time ``runtime.evaluation.EvalClock`` takes out of the step time; the model's
forward passes go to ``EvalClock.on_root_pass``) and ``mon.dataloader``'s batches.
``Accounting`` subscribes to them; its methods are the watchers' callbacks."""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import Any

import torch

from ..anatomy.marks import PhaseMarks
from ..anatomy.verdict import LoaderFacts, loader_facts
from ..batch.loader import DynamicBatchSampler, MonitoredDataLoader, batch_length
from ..maxbatch.job import ProbeSource
from ..noise.autograd import ExampleCounter
from ..runtime import audience, loader_watch, mode_watch
from ..runtime.context import JobContext
from ..runtime.evaluation import EvalClock
from ..runtime.forward_watch import ForwardWatch
from ..runtime.hot_path import FINISHED, NEVER, HotPath
from ..runtime.samples import CHECK_EVERY, StepSamples, StepTally


@dataclasses.dataclass(eq=False, repr=False)
class Accounting:
    """The samples and evaluation time the job's signals say (training thread)."""

    model: torch.nn.Module | None
    samples: StepSamples
    evals: EvalClock
    watch: ForwardWatch
    phases: PhaseMarks | None
    hot: HotPath
    probe_source: ProbeSource
    ctx: JobContext
    tally: StepTally
    examples: ExampleCounter
    declared: bool  # a batch size declared: its samples are the step's
    # (iterator id, facts) of the training loader's iterator
    loader_facts: tuple[int, LoaderFacts] | None = dataclasses.field(default=None, init=False)
    # called once per training DataLoader iterator (an epoch), on the training thread
    on_new_training_iterator: Callable[[Any], None] | None = dataclasses.field(
        default=None, init=False
    )
    training_epochs: int = dataclasses.field(default=0, init=False)  # its iterators begun

    def __post_init__(self) -> None:
        self._guard = self.ctx.guard
        self._warn = self.ctx.warn_once
        self._has_batchnorm = self.model is not None and any(
            isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in self.model.modules()
        )
        self._loader_sizes: tuple[Callable[[], Any], bool, int | None] = (lambda: None, False, None)

    def subscribe(self) -> None:
        """Listen to the model's modes and to every DataLoader."""
        if self.model is not None:
            mode_watch.subscribe(self._on_mode_switch)
        if (why := loader_watch.subscribe(self._on_loader)) is not None:
            self._warn("loaders_unseen", f"{why}; evaluation time counts as step time")

    def unsubscribe(self) -> None:
        loader_watch.unsubscribe(self._on_loader)
        mode_watch.unsubscribe(self._on_mode_switch)

    def at_boundary(self, step: int, _now: float) -> int:
        """Count the model's examples on step + 1 if nothing else says its samples (no
        DataLoader, no declared size), and the step the count next changes at."""
        tally, counter = self.tally, self.examples
        wanted = not self.declared and tally.counts_model_examples(step + 1)
        if wanted is not counter.wanted:
            counter.want(wanted)
        if self.declared:
            return FINISHED  # its samples are the declared size's: nothing to count, ever
        if tally.batches_seen:
            return NEVER
        if wanted and tally.steady is not None:
            return step + 1  # a check: off again after it
        # until the count is steady, look again every CHECK_EVERY steps (the checks' stride,
        # a larger power of two once the rate is known, is a multiple of it)
        every = tally.check_every if tally.steady is not None else CHECK_EVERY
        return (step // every + 1) * every - 1  # the next check, or steadiness

    def training_iterator(self) -> Any:
        """The DataLoader iterator the job's training batches come from now (None: none)."""
        return self._loader_sizes[0]()

    def loader(self) -> LoaderFacts | None:
        """The facts of the training DataLoader a sampled step last drew from."""
        return self.loader_facts[1] if self.loader_facts is not None else None

    def _on_loader(self, iterator: Any, batch: Any, started: float, finished: float) -> None:
        """Any DataLoader's batch (loader_watch): training or evaluation activity; a
        training batch's samples count toward the step."""
        try:
            model = self.model
            if not torch.is_grad_enabled() or (model is not None and not model.training):
                self.evals.evaluate(finished)
                return
            self.evals.train(finished)
            if self.phases is not None and self.hot.sampling and batch is not None:
                self.phases.batch(started, finished)
                if self.loader_facts is None or self.loader_facts[0] != id(iterator):
                    self.loader_facts = (id(iterator), loader_facts(iterator))
            n = batch_length(batch) if batch is not None else None
            if n is None:
                return
            known = self._loader_sizes
            if known[0]() is not iterator:  # a new iterator (an epoch): its facts, once
                known = self._loader_sizes = self._sizes_of(iterator)
                self.training_epochs += 1
                if self.on_new_training_iterator is not None:
                    self.on_new_training_iterator(iterator)
            if known[1]:
                self.samples.draw(n, known[2])
        except Exception as exc:
            self._guard.report("DataLoader batch accounting", exc)

    @staticmethod
    def _sizes_of(iterator: Any) -> tuple[Callable[[], Any], bool, int | None]:
        """(a weak reference to the iterator, whether its batches count as samples here — not
        bsmon's own resizable loader's, which counts them itself — and its nominal size)."""
        try:
            ref: Callable[[], Any] = weakref.ref(iterator)
        except TypeError:
            ref = lambda: None  # noqa: E731  (never matches: looked up on every batch)
        counted = not isinstance(iterator._index_sampler, DynamicBatchSampler)
        return ref, counted, loader_watch.nominal_batch_size(iterator)

    def _on_mode_switch(self, module: Any, _result: Any, started: float, finished: float) -> None:
        """``model.eval()`` starts an evaluation, ``model.train()`` ends it (mode_watch)."""
        if module is not self.model:
            return  # one of its submodules, or another model
        try:
            if module.training:
                if self.evals.open:
                    self.evals.evaluate(started)
                self.evals.train(finished)
            else:
                self.evals.evaluate(finished)
        except Exception as exc:
            self._guard.report("model.train()/eval() accounting", exc)

    def samples_reason(self, step: int) -> str | None:
        """Agent thread: why step ``step``'s samples are unknown, warned once (None for the
        first step: the model's inputs are counted from the second on)."""
        if step <= 1:
            return None
        watch = self.watch
        seen = watch.blocked() or watch.uncounted or "the model's own forward was not called"
        fix = audience.say(
            attach="attach(..., batch_size=N) declares them",
            run="bsmon run counts the batches of a DataLoader or the model's input",
        )
        reason = f"samples not counted: no DataLoader batch was seen and {seen}; {fix}"
        self._warn("samples_not_counted", reason)
        return reason

    def on_batch(self, loader: MonitoredDataLoader, batch: Any, indices: list[int]) -> None:
        """A batch of ``mon.dataloader``: its samples, kept for an out-of-memory requeue."""
        try:
            n = batch_length(batch)
            size = n if n is not None else len(indices)
            self.samples.count(size, one_pass=True)
            self.hot.batches_since_step.append((loader, indices))
            self.probe_source.offer(batch, size)
            if self._has_batchnorm and size < loader.dynamic_sampler.current_size():
                self._warn_uneven_batch(size)
        except Exception as exc:
            self._guard.report("dataloader batch accounting", exc)

    def _warn_uneven_batch(self, size: int) -> None:
        self._warn(
            "uneven_batchnorm_batch",
            f"a batch of {size} samples (the end of an epoch) meets BatchNorm in training "
            "mode: its statistics from so few samples are noisy, and NaN or an error "
            "with 1; pass drop_last=True to mon.dataloader",
        )
