"""Which batch sizes the monitor's keys step to, and which sizes are refused (and why)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

StepRule = str | int | Sequence[int]


@dataclass(frozen=True)
class BatchPolicy:
    """``step``: "double" (×2 / ÷2), an int (add / subtract it), or a list of allowed sizes.

    ``multiple_of`` is the micro-batch size in accumulation mode: the batch is then always a
    whole number of micro-batches.
    """

    step: StepRule = "double"
    min_size: int = 1
    max_size: int | None = None
    multiple_of: int = 1
    min_reason: str = ""  # why there is a minimum, when it is not the user's choice

    def __post_init__(self) -> None:
        step = self.step
        if isinstance(step, str):
            if step != "double":
                raise ValueError(f"batch_step must be 'double', an int or a list, got {step!r}")
        elif isinstance(step, bool) or not isinstance(step, (int, Sequence)):
            raise ValueError(f"batch_step must be 'double', an int or a list, got {step!r}")
        elif isinstance(step, int) and step < 1:
            raise ValueError(f"an additive batch_step must be at least 1, got {step}")
        elif not isinstance(step, int):
            sizes = list(step)
            if not sizes or any(
                isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes
            ):
                raise ValueError(f"batch_step sizes must be positive integers, got {step!r}")
            object.__setattr__(self, "step", tuple(sorted(set(sizes))))
        if self.min_size < 1:
            raise ValueError(f"min_batch_size must be at least 1, got {self.min_size}")
        if self.max_size is not None and self.max_size < self.min_size:
            raise ValueError(
                f"max_batch_size {self.max_size} is below min_batch_size {self.min_size}"
            )

    def refusal(self, value: int) -> str | None:
        """Why ``value`` is refused, or None when it is allowed."""
        if value < self.min_size:
            why = f" ({self.min_reason})" if self.min_reason else ""
            return f"{value} is below the minimum batch size {self.min_size}{why}"
        if self.max_size is not None and value > self.max_size:
            return (
                f"{value} is above the maximum batch size {self.max_size} "
                "(attach(max_batch_size=...))"
            )
        if value % self.multiple_of:
            return (
                f"{value} is not a multiple of the micro-batch size {self.multiple_of} "
                "(accumulation mode changes the number of micro-batches)"
            )
        if isinstance(self.step, tuple) and value not in self.step:
            return f"{value} is not one of the allowed sizes {list(self.step)}"
        return None

    def next_size(self, current: int, direction: str) -> int | None:
        """The size ``+`` (direction "up") or ``-`` ("down") asks for, or None at a limit."""
        up = direction == "up"
        step = self.step
        if isinstance(step, tuple):
            if up:
                index = bisect.bisect_right(step, current)
            else:
                index = bisect.bisect_left(step, current) - 1
            candidate = step[index] if 0 <= index < len(step) else None
        elif isinstance(step, int):
            candidate = current + step if up else current - step
        else:
            candidate = current * 2 if up else current // 2
        if candidate is None:
            return None
        candidate = self._round_to_multiple(candidate, up)
        if candidate == current or self.refusal(candidate) is not None:
            return None
        return candidate

    def _round_to_multiple(self, value: int, up: bool) -> int:
        unit = self.multiple_of
        if value % unit == 0:
            return value
        return (value // unit + (1 if up else 0)) * unit
