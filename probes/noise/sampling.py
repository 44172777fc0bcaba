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

from typing import NamedTuple

import torch
from torch import Tensor

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


def rows_of(examples: int, measured: int) -> Rows | None:
    """The rows the ``measured``-th sampled step takes of a pass of ``examples`` (None: all)."""
    count = sample_size(examples)
    if count >= examples:
        return None
    return Rows(measured * count % examples, count, examples)
