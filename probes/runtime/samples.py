"""The samples of each training step, and the batch size a person would say the job uses.

From the best source there is, in this order:

1. what the job counts itself: ``mon.dataloader`` batches, or ``mon.job.count_samples`` (the
   framework integrations, ``bsmon run`` before the monitor existed);
2. the training batches any DataLoader yields (``loader_watch``: drawn with gradients on and
   the model in ``train()`` mode);
3. the examples of the model's forward passes (``forward_watch``), for jobs that cut their
   batches by hand; a closure step's several passes over one batch count once;
4. the batch size declared with ``attach(..., batch_size=N)``.

None of these: the samples are unknown (``None``, shown as n/a with the reason), never 0 —
except a step that drew no batch in a job whose batches come from a DataLoader: a loader that
fetches one batch ahead (timm's ``PrefetchLoader``, a look-ahead generator) drew it in the
step before, where it was counted, so that step trained 0 new samples.

The training thread keeps only the running counts of sources 1 and 2 (``StepSamples``) and
hands them over at each step's end; the agent thread weighs the sources (``StepTally``).

Source 3 costs every module call a global forward hook, so it is read on every step only until
the count has been the same for ``STEADY_AFTER`` steps in a row (a script that cuts a fixed
batch by hand, like nanoGPT's ``get_batch``); from then on one step in ``check_every`` is
counted and the steps between take the steady count. A check costs two boundaries and the
hook's registration (~130 µs on a CPU), so ``check_every`` follows the step rate: the
power of two at least ``CHECK_EVERY`` that puts the checks ``CHECK_PERIOD_S`` or more apart
(every 16 steps of a 50 ms step; every 2,048 of a 160 µs one, where every 16th cost each
step 8 µs). A checked step that differs ends that for good: every step is counted again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from itertools import groupby, repeat

from .progress import Progress

Taken = tuple[int, int]  # a step's samples from sources 1–2 and its first batch's size (0: unknown)
NOT_COUNTED = -1  # the model's examples were not counted on this step (a steady count holds)
STEADY_AFTER = 32  # equal counts in a row before the model's examples are only checked
CHECK_EVERY = 16  # once steady, the model's examples are counted on one step in this many
CHECK_PERIOD_S = 0.25  # or fewer: on a fast loop, checks at least this far apart


class StepSamples:
    """Training thread: the samples the job's batches say, as they come (a step that has any
    is not an ordinary one: ``progress.quiet``)."""

    def __init__(self, progress: Progress | None = None) -> None:
        self._progress = progress or Progress()
        self.last_batch: int | None = None  # the latest training batch: one pass's examples
        self.drawing = False  # this step has samples from sources 1 or 2
        self.passes_known = False  # the last step's batches were seen one by one (a DataLoader)
        self._counted = 0
        self._counted_first: int | None = None
        self._drawn = 0
        self._drawn_first: int | None = None
        self._one_pass_each = False

    def count(self, samples: int, batch_size: int | None = None, *, one_pass: bool = False) -> None:
        """The job's own count (source 1); ``batch_size``: the step's first batch, default
        ``samples``; ``one_pass``: the count is one batch (bsmon's own DataLoader)."""
        if one_pass:
            self.last_batch = samples
            self._one_pass_each = True
        self._counted += samples
        if self._counted_first is None:
            self._counted_first = batch_size or samples or None
        self.drawing = True
        self._progress.quiet = False

    def draw(self, examples: int, loader_batch_size: int | None) -> None:
        """A training batch from a DataLoader (source 2)."""
        self.last_batch = examples
        self._one_pass_each = True
        self._drawn += examples
        if self._drawn_first is None:
            self._drawn_first = loader_batch_size or examples
        self.drawing = True
        self._progress.quiet = False

    @property
    def so_far(self) -> int:
        """The step's samples until now (its micro-batches so far)."""
        return self._counted or self._drawn

    def take(self) -> Taken:
        """At the step's end (only when ``drawing``): its samples and first batch's size, then
        a fresh step."""
        taken = (self._counted or self._drawn, self._counted_first or self._drawn_first or 0)
        self.passes_known = self._one_pass_each
        self.discard()
        return taken

    def discard(self) -> None:
        """Forget the step's samples so far (they will run again: the OOM guard)."""
        self._counted, self._counted_first = 0, None
        self._one_pass_each = False
        self._drawn, self._drawn_first = 0, None
        self.drawing = False


def _runs(*columns: Sequence[int]) -> Iterator[tuple[tuple[int, ...], int]]:
    """The runs of equal rows of ``columns`` (equal lengths), as (row, length): one run
    without making a row per step when every column holds one value (the usual tick)."""
    steps = len(columns[0])
    if steps and all(column.count(column[0]) == steps for column in columns):
        yield tuple(column[0] for column in columns), steps
        return
    for row, run in groupby(zip(*columns, strict=True)):
        yield row, sum(1 for _ in run)


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


class StepTally:
    """Agent thread: each step's samples and the job's batch size, from what the training
    thread handed over."""

    def __init__(self) -> None:
        self.nominal = NominalBatch()
        self.batches_seen = False  # the job's batches say its samples (sources 1–2)
        self.steady: int | None = None  # the model's examples per step, while steady
        self.varies = False  # a checked step differed from the steady count: count them all
        self.check_every = CHECK_EVERY  # a power of two: a change keeps checks on its multiples
        self._run = 0
        self._last = 0

    def counts_model_examples(self, step: int) -> bool:
        """Whether ``step`` needs the model's examples counted (source 3)."""
        if self.batches_seen:
            return False
        return self.steady is None or step % self.check_every == 0

    def follow_rate(self, steps: int, seconds: float) -> None:
        """Space the checks of a steady count by ``CHECK_PERIOD_S`` or more at the rate of
        ``steps`` in ``seconds`` (the agent thread, once a tick)."""
        if steps <= 0 or seconds <= 0:
            return
        wanted, every = steps * CHECK_PERIOD_S / seconds, CHECK_EVERY
        while every < wanted:
            every *= 2
        self.check_every = every

    def resolve(
        self, drawn: int, first: int, model_examples: int, declared: int
    ) -> tuple[int | None, int | None]:
        """A step's samples and the job's batch size, from its samples ``drawn`` (sources 1-2)
        and their ``first`` batch's size (0: unknown), the ``model_examples`` (source 3, or
        ``NOT_COUNTED``) and the ``declared`` batch size (0: none)."""
        if drawn:
            self.batches_seen = True
        if model_examples == NOT_COUNTED:
            model_examples = self.steady or 0
        elif not drawn and not declared and model_examples:
            self._follow(model_examples)
        if drawn or not self.batches_seen:
            samples = drawn or model_examples or declared or None
        else:  # a loader that fetches ahead drew this step's batch in the step before
            samples = 0
        if declared:
            return samples, declared
        return samples, self.nominal.update(first or model_examples or None)

    def resolve_all(
        self,
        drawn: Sequence[int],
        first: Sequence[int],
        examples: Sequence[int],
        declared: Sequence[int],
    ) -> tuple[list[int | None], list[int | None]]:
        """``resolve`` for a tick's steps (columns): each run of equal inputs is resolved step
        by step only until a step leaves the tally as it found it; the rest of the run then
        resolves the same (``resolve`` depends on the inputs and the tally alone), so a
        steady job costs a few calls per tick, not one per step."""
        samples: list[int | None] = []
        sizes: list[int | None] = []
        for inputs, length in _runs(drawn, first, examples, declared):
            left = length
            while left:
                before = self._state()
                step_samples, size = self.resolve(*inputs)
                samples.append(step_samples)
                sizes.append(size)
                left -= 1
                if left and self._state() == before:
                    samples.extend(repeat(step_samples, left))
                    sizes.extend(repeat(size, left))
                    break
        return samples, sizes

    def _state(self) -> tuple:
        nominal = self.nominal
        return (
            self.batches_seen,
            self.steady,
            self.varies,
            self._run,
            self._last,
            nominal.size,
            nominal.candidate,
            nominal.varies,
            nominal.last,
            nominal.repeats,
        )

    def _follow(self, examples: int) -> None:
        if self.steady is not None and examples != self.steady:
            self.steady, self.varies = None, True
        # capped: only reaching STEADY_AFTER matters, and a steady run then leaves it as it is
        self._run = min(self._run + 1, STEADY_AFTER) if examples == self._last else 1
        self._last = examples
        if self._run >= STEADY_AFTER and not self.varies:
            self.steady = examples
