"""Which steps the step anatomy times: one in every few, drawn at random.

Timing a step's phases costs the training thread a few dozen Python calls (the marks of each
DataLoader batch, forward and backward pass); an ordinary step costs none. A random stride
(rather than every n-th step) keeps a loop with a period of its own (evaluation every 10
steps, gradient accumulation over 4) from being sampled at the same phase each time.

``BSMON_ANATOMY_STRIDE`` overrides the stride for diagnostics and tests: ``1`` times every
step, ``4-12`` (the default) draws each gap between 4 and 12 steps.
"""

from __future__ import annotations

import os
import random

DEFAULT_STRIDE = (4, 12)
STRIDE_VARIABLE = "BSMON_ANATOMY_STRIDE"


def stride_from_environment(text: str | None = None) -> tuple[tuple[int, int], str | None]:
    """The stride ``(low, high)`` and, when the variable is set but wrong, why it is ignored."""
    text = os.environ.get(STRIDE_VARIABLE) if text is None else text
    if not text:
        return DEFAULT_STRIDE, None
    low, _, high = text.partition("-")
    try:
        stride = (int(low), int(high or low))
    except ValueError:
        stride = (0, 0)
    if not 1 <= stride[0] <= stride[1]:
        why = f"{STRIDE_VARIABLE}={text!r} is not a stride like 1 or 4-12; using 4-12"
        return DEFAULT_STRIDE, why
    return stride, None


class AnatomySampler:
    """The next step the anatomy times; ``due(step)`` draws the one after when it comes."""

    def __init__(self, stride: tuple[int, int] = DEFAULT_STRIDE, seed: int = 0x5EED) -> None:
        self.stride = stride
        self.next_step = 2  # the first step with a step before it to begin from
        self._rng = random.Random(seed)

    def due(self, step: int) -> bool:
        if step < self.next_step:
            return False
        low, high = self.stride
        self.next_step = step + low + int(self._rng.random() * (high - low + 1))
        return True
