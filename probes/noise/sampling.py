"""Which examples of a forward pass a measured step takes per-example norms of.

On a sequence or an image, per-example norms cost about as much as the layer's own weight
gradient: a 3-D linear layer's Gram matrices or materialised per-example gradients, a
convolution's per-example kernels. A measured step of the tracking benchmark's transformer
cost 47% more than a plain one on the CPU, and one on an H100 twice a plain one, so the cost
budget measured one step in fifty to a hundred and the live value lagged far behind a moving
B_simple. Once a model is seen to have such layers, a measured step takes the norms of a
quarter of each pass's examples (at least ``SAMPLE_MIN``): that part of its cost falls
fourfold, and the same budget measures about twice as many steps.

The step's estimate stays unbiased: every example of the batch is an equally good draw of
the small batch (B_s = 1) against the whole batch's gradient, which is still taken over all
of them. It is noisier per step, by less than the steps gained (``benchmarks/
noise_tracking.py``'s transformer). Which examples rotates from one measured step to the
next by the sample's size, so every position of a batch is taken equally often: a loader
that puts different kinds of example at fixed positions biases nothing. On 2-D inputs the
norms cost next to nothing beside bsmon's fixed work on a measured step, and all examples are
taken.
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypeVar

import torch
from torch import Tensor, nn

Lean = TypeVar("Lean", bound=Any)  # per_example.LinearCall
SAMPLE_SHARE = 4  # a measured step takes one example in this many ...
SAMPLE_MIN = 16  # ... but at least this many


def sample_size(examples: int) -> int:
    """Examples whose norms are taken in a pass of ``examples``."""
    return min(examples, max(SAMPLE_MIN, -(-examples // SAMPLE_SHARE)))


class Rows(NamedTuple):
    """``count`` consecutive examples from ``start``, wrapping past the pass's ``examples``."""

    start: int
    count: int
    examples: int

    def take(self, t: Tensor) -> Tensor:
        """These rows of ``t`` (examples along dim 0)."""
        end = self.start + self.count
        if end <= self.examples:
            return t[self.start : end]
        return torch.cat((t[self.start :], t[: end - self.examples]))

    def cut(
        self,
        g: Tensor,
        x: Tensor | None,
        term: Tensor | None,
        stats: tuple[Tensor, Tensor] | None,
        stats_per_example: bool,
    ) -> tuple[Tensor, Tensor | None, Tensor | None, tuple[Tensor, Tensor] | None]:
        """A layer call's output gradient, input, input term and statistics cut to these
        rows: the statistics only when they are per example (a LayerNorm's; a BatchNorm's
        are per channel)."""
        cut = stats
        if stats is not None and stats_per_example:
            cut = (self.take(stats[0]), self.take(stats[1]))
        return (
            self.take(g),
            self.take(x) if x is not None else None,
            self.take(term) if term is not None else None,
            cut,
        )


def rows_of(examples: int, measured: int) -> Rows | None:
    """The rows the ``measured``-th sampled step takes of a pass of ``examples`` (None: all)."""
    count = sample_size(examples)
    if count >= examples:
        return None
    return Rows(measured * count % examples, count, examples)


class Sampler:
    """One per-example source's sampling: whether its measured steps take a sample, which
    rows, and what the latest pass took. Decided between steps, so a step never mixes sampled
    and whole passes."""

    def __init__(self, allowed: bool) -> None:
        self.allowed = allowed  # a rank's units enter other ranks' sums as they are: not there
        self.on = False  # this step takes a sample of each pass's examples
        self.heavy_seen = False  # a measured layer's input had three dims or more: dear norms
        self.steps = 0  # sampled steps so far: which rows the next one takes
        self.last: tuple[int, int] | None = None  # (taken, of) in the latest pass

    def rows(self, examples: int) -> Rows | None:
        """The rows this sampled step takes of a pass of ``examples`` (None: all); per_example
        calls it only while ``on``."""
        return rows_of(examples, self.steps)

    def taken(self, passes: dict[int, int]) -> int:
        """The examples whose norms this sampled step took of ``passes`` (pass id →
        examples); per_example calls it only while ``on``."""
        total = 0
        for examples in passes.values():
            rows = self.rows(examples)
            taken = rows.count if rows is not None else examples
            self.last = (taken, examples)
            total += taken
        return total

    def lean(self, calls: list[tuple[Lean, Tensor]]) -> list[tuple[Lean, Tensor]]:
        """Lean linear calls and their |g_i| (per_example's ``LinearCall``: ``rows``,
        ``a_norm``) cut to this sampled step's rows; per_example calls it only while ``on``."""
        out = []
        for call, g_norm in calls:
            rows = self.rows(call.rows)
            if rows is None:
                out.append((call, g_norm))
            else:
                out.append((call._replace(a_norm=rows.take(call.a_norm)), rows.take(g_norm)))
        return out

    def end_step(self, measured: bool, batch_norms: list[nn.Module]) -> None:
        """After a step; not while a BatchNorm trains on batch statistics, whose norms need
        the whole batch."""
        if self.on and measured:
            self.steps += 1
        self.on = self.allowed and self.heavy_seen and not any(m.training for m in batch_norms)

    def describe(self) -> str:
        if not self.on or self.last is None or self.last[0] >= self.last[1]:
            return ""
        taken, of = self.last
        return f"; norms of {taken} of {of} examples a step (rotating)"
