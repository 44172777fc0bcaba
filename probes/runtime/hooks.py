"""Optimizer step hooks that count each user-level ``optimizer.step()`` exactly once.

A subclass whose ``step`` calls ``super().step()`` fires the hooks twice for one step once
an instance of the parent class exists (torch wraps both classes' ``step``). A depth counter
handles that; should a step raise, the counter would stay raised forever, so a pre-hook that
finds it raised counts torch's step wrappers on the stack to tell a nested call from a stale
counter. Every callback runs inside a guard: an exception in bsmon code is counted and
reported, never raised into the job.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from .fault_guard import FaultGuard


def _step_wrapper_code() -> Any:
    make = getattr(torch.optim.Optimizer, "profile_hook_step", None)
    if make is None:
        return None
    return make(lambda *args, **kwargs: None).__code__


_WRAPPER_CODE = _step_wrapper_code()


class Progress:
    """The training job's step count, advanced at each step's end; the parts that stamp an
    event or a record with its step call it (``progress()`` is the current step)."""

    __slots__ = ("step",)

    def __init__(self) -> None:
        self.step = 0

    def __call__(self) -> int:
        return self.step


def _wrapper_frames_on_stack() -> int:
    count = 0
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code is _WRAPPER_CODE:
            count += 1
        frame = frame.f_back
    return count


def steps_with_closure(args: tuple, kwargs: dict) -> bool:
    """Whether a step was given a closure (LBFGS and the like: the closure re-evaluates the
    model, several times per step for LBFGS). Step hooks get ``(optimizer, closure, ...)``:
    torch passes the wrapped method's arguments, ``self`` first."""
    positional = args[1:] if args and isinstance(args[0], torch.optim.Optimizer) else args
    closure = kwargs.get("closure", positional[0] if positional else None)
    return callable(closure)


class StepHooks:
    """Installs pre/post step hooks on one optimizer and calls ``on_step_begin(closure)`` and
    ``on_step_end()`` once per outermost step."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        on_step_begin: Callable[[bool], None],
        on_step_end: Callable[[], None],
        guard: FaultGuard,
    ) -> None:
        self._depth = 0
        self._on_begin = on_step_begin
        self._on_end = on_step_end
        self._guard = guard
        self.stale_recoveries = 0
        self._handles = [
            optimizer.register_step_pre_hook(self._pre_hook),
            optimizer.register_step_post_hook(self._post_hook),
        ]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    @property
    def installed(self) -> bool:
        return bool(self._handles)

    def _pre_hook(self, _optimizer: Any, args: tuple, kwargs: dict) -> None:
        try:
            if self._depth and _WRAPPER_CODE is not None and _wrapper_frames_on_stack() <= 1:
                self._depth = 0  # the previous step raised before its post-hook ran
                self.stale_recoveries += 1
            self._depth += 1
            if self._depth == 1:
                self._on_begin(steps_with_closure(args, kwargs))
        except Exception as exc:
            self._guard.report("optimizer pre-step hook", exc)

    def _post_hook(self, _optimizer: Any, _args: Any, _kwargs: Any) -> None:
        try:
            self._depth = max(0, self._depth - 1)
            if self._depth == 0:
                self._on_end()
        except Exception as exc:
            self._guard.report("optimizer post-step hook", exc)
