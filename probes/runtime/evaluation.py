"""Evaluation time inside the training loop, kept apart from step time.

A validation pass between two optimizer steps would otherwise make that step look seconds
long (a false stall, a wrong p99). The training thread signals what it sees, O(1) each:

- ``train(t)``: training activity up to time ``t`` (a training batch drawn, a forward pass
  with gradients);
- ``evaluate(t)``: evaluation activity up to time ``t`` (a batch drawn, or a forward pass of
  the model, with gradients off or in ``eval()`` mode).

An evaluation span starts where training activity last stopped (the end of the previous step,
or a training batch drawn after it) and ends at its last evaluation signal: from the moment
training paused to the end of the last evaluation batch or pass. ``take(t)`` at the end of a
step returns the step's evaluation seconds and starts the next window at ``t``. The hot path
calls it only when ``pending`` (an evaluation signal since the last step); a signal clears
``progress.quiet`` so that the step takes the hot path's full path. Where training activity
last stopped is the latest step's end, ``latest_end()`` (the step ring's, which both the
hot path's short and full paths write), or the end of the step ``take()`` last closed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .progress import Progress


class EvalClock:
    __slots__ = (
        "_closed",
        "_eval_end",
        "_eval_start",
        "_last_train",
        "_latest_end",
        "_progress",
        "pending",
        "spans",
    )

    def __init__(
        self,
        now: float,
        progress: Progress | None = None,
        latest_end: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self._progress = progress or Progress()
        self._latest_end = latest_end  # the latest step's end, however it was recorded
        self._last_train = now
        self.pending = False  # an evaluation signal came since the last take()
        self._eval_start: float | None = None  # the open span's start
        self._eval_end = 0.0
        self._closed = 0.0  # seconds of the spans already closed in this step window
        self.spans = 0  # evaluation spans so far

    @property
    def open(self) -> bool:
        """An evaluation span is open (signalled, not yet closed)."""
        return self._eval_start is not None

    def train(self, t: float) -> None:
        if self._eval_start is not None:
            self._close()
        self._last_train = max(self._last_train, t)

    def evaluate(self, t: float) -> None:
        self.pending = True
        self._progress.quiet = False
        if self._eval_start is None:
            self._eval_start = max(self._last_train, self._latest_end())
            self._eval_end = t
            self.spans += 1
        self._eval_end = max(self._eval_end, t)

    def on_root_pass(self, root_pass: Any, _output: Any) -> None:
        """A call of the model (``ForwardWatch.on_root``): training with gradients in
        ``train()`` mode, evaluation otherwise."""
        if root_pass.grad and root_pass.training:
            self.train(time.perf_counter())
        else:
            self.evaluate(time.perf_counter())

    def take(self, now: float) -> float:
        """The evaluation seconds of the step that ends ``now``."""
        if self._eval_start is not None:
            self._eval_end = min(self._eval_end, now)
            self._close()
        seconds, self._closed = self._closed, 0.0
        self._last_train = now
        self.pending = False
        return seconds

    def _close(self) -> None:
        assert self._eval_start is not None
        self._closed += max(0.0, self._eval_end - self._eval_start)
        self._eval_start = None
