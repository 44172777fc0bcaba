"""A model switched between ``train()`` and ``eval()``, seen by wrapping ``nn.Module.train``.

An evaluation loop that cuts its own batches (nanoGPT's ``estimate_loss``: ``model.eval()``,
forward passes under ``torch.no_grad()``, ``model.train()``) draws no DataLoader batch, and
its forward passes are seen only while the forward watch is held — which, once a job's
samples are steady, is one step in 16. The switches themselves are rare and cost nothing
on an ordinary step, so every monitor hears of them: the time from ``eval()`` back to
``train()`` is evaluation, not step time.

``nn.Module.train`` calls itself on every submodule; a subscriber is called for each, with
the module, and looks for its own model. It must do O(1) work and never raise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .call_watch import CallWatch

OnSwitch = Callable[[Any, Any, float, float], None]  # (module, result, start, end)


def _locate() -> tuple[Any, str] | str:
    from torch import nn

    return nn.Module, "train"


_watch = CallWatch(_locate)


def subscribe(callback: OnSwitch) -> str | None:
    """Call ``callback`` after every ``Module.train(mode)`` (``eval()`` included)."""
    return _watch.subscribe(callback)


def unsubscribe(callback: OnSwitch) -> None:
    _watch.unsubscribe(callback)
