"""The training thread's scheduled slow path: what runs at the end of the steps the hot path
was asked for (``runtime.hot_path.StepWork.on_boundary``), never on an ordinary step. Each
part that needs those steps says what it does there (``at_boundary``, the ``Extension``
face); the boundary asks them in turn and schedules the soonest step any of them needs. A
part whose work there is over for good says ``FINISHED`` and is not asked again: a step
measured by the noise scale comes through here, and each part asked is a call on it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from ..runtime.hot_path import FINISHED, NEVER, HotPath


class TakesBoundaries(Protocol):
    def at_boundary(self, step: int, now: float) -> int: ...


class Boundary:
    """``at_boundary(step, now)``: every part's work at the end of ``step``, in order; the
    next step whose end needs a boundary."""

    def __init__(self, parts: Sequence[TakesBoundaries], hot: HotPath) -> None:
        self._parts = tuple(parts)
        self._hot = hot
        # told on the training thread whether the next step is one the anatomy samples
        self.listeners: list[Callable[[bool], None]] = []

    def at_boundary(self, step: int, now: float) -> int:
        following = NEVER
        for part in self._parts:  # compared, not min(): a call less per part on this path
            wanted = part.at_boundary(step, now)
            if wanted < following:
                following = wanted
            elif wanted == FINISHED:
                self._parts = tuple(p for p in self._parts if p is not part)
        hot = self._hot
        hot.need_pre_hook(hot.noise_due or hot.sampling)
        for listener in self.listeners:
            listener(hot.sampling)
        return following
