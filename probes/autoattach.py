"""Zero-code attach: the agent ``bsmon run`` loads into a training script nobody changed.

``boot/sitecustomize.py`` calls ``install()`` right after the process imports torch.
``install()`` starts nothing; it

- registers PyTorch's global optimizer step pre-hook, which fires for every optimizer,
  including ones created before it was registered. The first ``optimizer.step()`` of the
  process attaches a normal ``Monitor`` (so whatever the Monitor does, e.g. the noise scale,
  works here too) to that optimizer and to the model found through its parameters;
- wraps DataLoader iteration, so the samples each step draws are counted (per step, from the
  loader that yielded last: a validation pass between steps is not counted);
- wraps ``Tensor.backward``, so the scalar the script calls ``backward()`` on is shown as its
  loss (as the script computed it: divided for accumulation, or scaled by AMP, if it is).

A process that never steps an optimizer (torchrun's launcher, DataLoader workers, tools)
never attaches: no thread, no socket. Batch-size control is off, with the reason and how to
turn it on: the script's own DataLoaders cannot be resized from outside.

Rules of the house: every callback is O(1) on the training thread, apart from the one-time
attach at the first step (which also scans the heap once for the model, ~0.1 s per 200k
objects); every exception inside bsmon code is caught, counted and shown as an event.
"""

from __future__ import annotations

import functools
import gc
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from . import distributed
from .data import batch_length
from .integrations.common import disable_batch_control, note, rank_name
from .protocol import Event
from .safety import FaultGuard

CONTROL_REASON = (
    "bsmon run cannot resize the script's own loaders; "
    "attach(..., batch_size=N) and mon.dataloader() in the script enable it"
)
PROBE_REASON = (
    "bsmon run cannot give the probe a batch size or a loss; "
    "attach(..., batch_size=N, loss_fn=...) in the script enables it"
)
EARLY_EVENTS = 20  # events kept from before the first step (errors in the wrappers)

_installed: list[AutoAttach] = []  # this process's agent, once installed


def install(name: str) -> AutoAttach | None:
    """Install the zero-code agent in this process (once); returns it, or None if it was
    already installed."""
    if _installed:
        return None
    agent = AutoAttach(name or _script_name())
    agent.install()
    _installed.append(agent)
    return agent


def installed() -> AutoAttach | None:
    return _installed[0] if _installed else None


def _script_name() -> str:
    from .agent import _default_name

    return _default_name()


class AutoAttach:
    def __init__(self, name: str) -> None:
        self.name = name
        self.monitor: Any = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.model: nn.Module | None = None
        self.stood_down: str | None = None  # why this process is not monitored, if it is not
        self.guard = FaultGuard(self._emit, lambda: self.monitor.step if self.monitor else 0)
        self._early: list[Event] = []
        self._early_loss: torch.Tensor | None = None
        self._others: set[int] = set()
        # samples drawn since the last step, from the loader (iterator) that yielded last
        self._source = 0
        self._first = 0
        self._total = 0
        self._unwrap: list[Callable[[], None]] = []  # puts back what _wrap_* replaced
        self._hook: Any = None

    # -- installation ----------------------------------------------------------------------

    def install(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self._hook = register_optimizer_step_pre_hook(self._pre_step)
        self._wrap_dataloader()
        self._wrap_backward()

    def uninstall(self) -> None:
        """Remove the hook and the wrappers (not from inside an optimizer step: torch is
        iterating over the hooks then)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self._unwrap_all()

    def _unwrap_all(self) -> None:
        while self._unwrap:
            self._unwrap.pop()()

    def _wrap_dataloader(self) -> None:
        from torch.utils.data import dataloader

        iterator_class = getattr(dataloader, "_BaseDataLoaderIter", None)
        original = getattr(iterator_class, "__next__", None)
        if iterator_class is None or original is None:
            self._note_early("this torch has no _BaseDataLoaderIter: samples are not counted")
            return
        agent = self

        @functools.wraps(original)
        def __next__(iterator: Any) -> Any:
            batch = original(iterator)
            agent._on_batch(id(iterator), batch)
            return batch

        iterator_class.__next__ = __next__
        self._unwrap.append(lambda: setattr(iterator_class, "__next__", original))

    def _wrap_backward(self) -> None:
        original = torch.Tensor.backward
        agent = self

        @functools.wraps(original)
        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            agent._on_backward(tensor)
            return original(tensor, *args, **kwargs)

        torch.Tensor.backward = backward  # type: ignore[method-assign]
        self._unwrap.append(lambda: setattr(torch.Tensor, "backward", original))

    # -- training-thread callbacks -------------------------------------------------------------

    def _on_batch(self, source: int, batch: Any) -> None:
        try:
            n = batch_length(batch)
            if n is None:
                return
            if source != self._source:  # another loader: what the previous one drew is not
                self._source, self._first, self._total = source, n, n  # this step's
            elif self._total:
                self._total += n
            else:
                self._first = self._total = n
        except Exception as exc:
            self.guard.report("counting a DataLoader batch", exc)

    def _on_backward(self, tensor: torch.Tensor) -> None:
        try:
            if tensor.numel() != 1:
                return
            if self.monitor is not None:
                self.monitor.log(loss=tensor)
            elif self.stood_down is None:
                self._early_loss = tensor.detach()
        except Exception as exc:
            self.guard.report("reading the loss at backward()", exc)

    def _pre_step(self, optimizer: torch.optim.Optimizer, _args: Any, _kwargs: Any) -> None:
        try:
            if self.monitor is None:
                if self.stood_down is not None:
                    return
                try:
                    self._attach(optimizer)
                except Exception as exc:
                    self._stand_down(f"could not attach ({type(exc).__name__}: {exc})")
                if self.monitor is None:
                    return
            if optimizer is not self.optimizer:
                self._note_other(optimizer)
                return
            if self._total:
                self.monitor.count_samples(self._total, self._first)
                self._total = 0
        except Exception as exc:
            self.guard.report("the optimizer step pre-hook", exc)

    # -- attach (once, at the first optimizer step) --------------------------------------------

    def _attach(self, optimizer: torch.optim.Optimizer) -> None:
        from .agent import attach, live_monitors

        if any(True for _ in live_monitors()):
            self._stand_down("the script attaches bsmon itself; bsmon run leaves it to that")
            return
        started = time.perf_counter()
        try:
            model = find_model(optimizer)
        except Exception as exc:
            model = None
            self.guard.report("looking for the model", exc)
        search_s = time.perf_counter() - started
        rank, world_size = distributed.world()
        monitor = attach(model, optimizer, name=rank_name(self.name, rank, world_size))
        disable_batch_control(monitor, CONTROL_REASON)
        monitor.router.disable("probe", PROBE_REASON)
        self.monitor, self.optimizer, self.model = monitor, optimizer, model
        for event in self._early:
            monitor.emit(event)
        self._early.clear()
        if self._early_loss is not None:
            monitor.log(loss=self._early_loss)
            self._early_loss = None
        note(
            monitor,
            "zero_code",
            f"bsmon run: watching {describe_optimizer(optimizer)} training "
            f"{describe_model(model)} (found in {search_s:.2f} s); the loss shown is the "
            "value backward() is called on; batch-size control is off (see its reason)",
            optimizer=type(optimizer).__name__,
            model=type(model).__name__ if model is not None else None,
            search_s=round(search_s, 4),
        )

    def _stand_down(self, why: str) -> None:
        self.stood_down = why
        self._early.clear()
        self._early_loss = None
        self._unwrap_all()  # the hook stays (torch may be iterating over it); it does nothing
        sys.stderr.write(f"bsmon: {why}\n")

    def _note_other(self, optimizer: torch.optim.Optimizer) -> None:
        key = id(optimizer)
        if key in self._others or len(self._others) >= 8:
            return
        self._others.add(key)
        note(
            self.monitor,
            "zero_code",
            f"another optimizer steps too ({describe_optimizer(optimizer)}); bsmon counts the "
            f"steps of the first one that stepped ({describe_optimizer(self.optimizer)})",
        )

    def _emit(self, event: Event) -> None:
        if self.monitor is not None:
            self.monitor.emit(event)
        elif len(self._early) < EARLY_EVENTS:
            self._early.append(event)

    def _note_early(self, message: str) -> None:
        self._emit(Event(t=time.time(), step=0, kind="zero_code", message=message, level="warning"))


# -- finding the model -----------------------------------------------------------------------


def find_model(optimizer: torch.optim.Optimizer) -> nn.Module | None:
    """The module the script trains with ``optimizer``: among the outermost modules alive
    (those no other module holds as a child), the one that holds the most of the optimizer's
    parameters, then the fewest others. A DDP or ``torch.compile`` wrapper is outermost, so it
    is the one found (it is what the script calls). None when no module holds any of them."""
    wanted = {id(p) for group in optimizer.param_groups for p in group["params"]}
    modules = [obj for obj in gc.get_objects() if issubclass(type(obj), nn.Module)]
    children = {id(child) for module in modules for child in module._modules.values()}
    best: tuple[int, int] | None = None
    found = None
    for module in modules:
        if id(module) in children:
            continue
        ids = {id(p) for p in module.parameters()}
        held = len(ids & wanted)
        if not held:
            continue
        score = (held, -len(ids - wanted))
        if best is None or score > best:
            best, found = score, module
    return found


def describe_model(model: nn.Module | None) -> str:
    if model is None:
        return "a model bsmon did not find (no nn.Module holds the optimizer's parameters)"
    count = sum(p.numel() for p in model.parameters())
    return f"{type(model).__name__} ({count:,} parameters)"


def describe_optimizer(optimizer: torch.optim.Optimizer | None) -> str:
    if optimizer is None:
        return "none"
    tensors = sum(len(group["params"]) for group in optimizer.param_groups)
    return f"{type(optimizer).__name__} over {tensors} tensors"
