"""The samples of each training step, and the batch size a person would say the job uses.

From the best source there is, in this order:

1. what the job counts itself: ``mon.dataloader`` batches, or ``mon.count_samples`` (the
   framework integrations, ``bsmon run`` before the monitor existed);
2. the training batches any DataLoader yields (``loader_watch``: drawn with gradients on and
   the model in ``train()`` mode);
3. the examples of the model's forward passes (``forward_watch``), for jobs that cut their
   batches by hand; a closure step's several passes over one batch count once;
4. the batch size declared with ``attach(..., batch_size=N)``.

None of these: the samples are unknown (``None``, shown as n/a with the reason), never 0.
"""

from __future__ import annotations

from ..batch.loader import NominalBatch


class StepSamples:
    def __init__(self) -> None:
        self.nominal = NominalBatch()
        self.last_batch: int | None = None  # the latest training batch: one pass's examples
        self._counted = 0
        self._counted_first: int | None = None
        self._drawn = 0
        self._drawn_first: int | None = None
        self._one_pass_each = False
        self.passes_known = False  # the last step's batches were seen one by one (a DataLoader)

    def count(self, samples: int, batch_size: int | None = None, *, one_pass: bool = False) -> None:
        """The job's own count (source 1); ``batch_size``: the step's first batch, default
        ``samples``; ``one_pass``: the count is one batch (bsmon's own DataLoader)."""
        if one_pass:
            self.last_batch = samples
            self._one_pass_each = True
        self._counted += samples
        if self._counted_first is None:
            self._counted_first = batch_size or samples or None

    def draw(self, examples: int, loader_batch_size: int | None) -> None:
        """A training batch from a DataLoader (source 2)."""
        self.last_batch = examples
        self._one_pass_each = True
        self._drawn += examples
        if self._drawn_first is None:
            self._drawn_first = loader_batch_size or examples

    @property
    def so_far(self) -> int:
        """The step's samples until now (its micro-batches so far)."""
        return self._counted or self._drawn

    @property
    def drawing(self) -> bool:
        """Whether this step has samples from sources 1 or 2 (no need to count the model's)."""
        return bool(self._counted or self._drawn)

    def end_step(self, model_examples: int, declared: int | None) -> tuple[int | None, int | None]:
        """The step's samples and the job's batch size, then a fresh step."""
        samples = self._counted or self._drawn or model_examples or declared or None
        if declared is not None:
            size: int | None = declared
        else:
            first = self._counted_first or self._drawn_first or model_examples or None
            size = self.nominal.update(first)
        self.passes_known = self._one_pass_each
        self.discard()
        return samples, size

    def discard(self) -> None:
        """Forget the step's samples so far (they will run again: the OOM guard)."""
        self._counted, self._counted_first = 0, None
        self._one_pass_each = False
        self._drawn, self._drawn_first = 0, None
