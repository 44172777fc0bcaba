"""Which steps the step anatomy times: one in every few, drawn at random.

Timing a step's phases costs the training thread a few dozen Python calls (the marks of each
DataLoader batch, forward and backward pass); an ordinary step costs none. A random stride
(rather than every n-th step) keeps a loop with a period of its own (evaluation every 10
steps, gradient accumulation over 4) from being sampled at the same phase each time.

The default draws each gap between 4 and 12 steps, and widens it on steps so fast that this
would time more than ``TIMED_PER_SECOND`` steps a second (``follow_rate``, from the agent
thread): a small model's 300 µs steps are then timed one in ~130, the live anatomy's last
``RECENT_STEPS`` timed steps still cover a few seconds, and the sampled steps' calls stay a
small share of the job's time however short its steps.

``BSMON_ANATOMY_STRIDE`` fixes the stride for diagnostics and tests: ``1`` times every
step, ``4-12`` draws each gap between 4 and 12 steps, whatever the step time.
"""

from __future__ import annotations

import os
import random

DEFAULT_STRIDE = (4, 12)
STRIDE_VARIABLE = "BSMON_ANATOMY_STRIDE"
TIMED_PER_SECOND = 25  # at most about this many steps timed a second, at the default stride


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

    def __init__(
        self,
        stride: tuple[int, int] = DEFAULT_STRIDE,
        seed: int = 0x5EED,
        *,
        follows_rate: bool = True,
    ) -> None:
        self.base = self.stride = stride
        self.follows_rate = follows_rate  # False: a stride set by hand holds
        self.next_step = 2  # the first step with a step before it to begin from
        self._rng = random.Random(seed)

    def follow_rate(self, step_time_s: float | None) -> None:
        """Agent thread: widen the stride on steps so fast that the base stride would time
        more than ``TIMED_PER_SECOND`` a second, keeping its spread (each gap drawn between
        half and 1.5 times the mean); back to the base stride on slower steps."""
        if not self.follows_rate or not step_time_s or step_time_s <= 0:
            return
        low, high = self.base
        gap = 1.0 / (step_time_s * TIMED_PER_SECOND)
        if gap <= (low + high) / 2:
            self.stride = self.base
        else:
            self.stride = (max(low, round(gap / 2)), max(high, round(gap * 1.5)))

    def due(self, step: int) -> bool:
        if step < self.next_step:
            return False
        low, high = self.stride
        self.next_step = step + low + int(self._rng.random() * (high - low + 1))
        return True
