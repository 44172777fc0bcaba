"""Which tensors are the loss (agent thread): the scalars ``backward()`` was called on
(``bsmon run``), unless a framework gave its loss first (``mon.job.loss_given``: accelerate's
``backward(loss)``), whose own ``backward()`` on a scaled copy is then not the loss.

The inbox brings them in order (``Inbox.losses``: a tensor, or ``(loss,)`` for a given
one), or, while the loop is fast, only the latest tensor (``Inbox.latest_loss``).

``reduction_of`` reads from a loss tensor's graph whether it sums over the batch (a VAE's
``reduction='sum'``: the value is the batch's total, the script prints it per example), so
that the loss shown says so. ``loss_of`` finds the loss in what a training step returned
(the framework callbacks, and the probe's replay of a step it saw).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch

from ..wire.protocol import Event

SUMMED = "summed over the batch"
SUMMED_SAID = (
    f"the loss shown is {SUMMED}: the script's loss adds up its examples (reduction='sum' or "
    "torch.sum), so per example it is the value shown divided by the batch size"
)
# nodes that join scalar terms without averaging them (a VAE's BCE + KLD, -0.5 * sum, AMP's
# loss × scale); a division may be the script's own / batch size: not walked through
_JOINS = {"AddBackward0", "SubBackward0", "MulBackward0", "MulBackward1", "NegBackward0"}
_REDUCTIONS = {"SumBackward0": "sum", "MeanBackward0": "mean"}
_SAVED_REDUCTION = {1: "mean", 2: "sum"}  # torch's at::Reduction of a loss function's node
_MAX_NODES = 32


def loss_of(output: Any) -> Any:
    """The loss in what a training step returned: a scalar tensor, ``output["loss"]``, or
    ``output.loss`` (a Hugging Face ``ModelOutput``); None when there is none."""
    if isinstance(output, torch.Tensor):
        return output if output.numel() == 1 else None
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return loss
    return None


class BackwardLosses:
    """A tick's losses, as ``take`` and ``take_latest`` find them; ``pop`` hands them over."""

    def __init__(self) -> None:
        self.tick: list[Any] = []  # this tick's losses
        self._given = False  # a loss was given: the next tensor at backward() is left out
        self._given_seen = False  # a framework gives the loss (the tensors are not it)
        self._latest_read: Any = None  # held until replaced: no new one takes its identity

    def take(self, records: list[Any]) -> None:
        """The inbox's records of ``backward()`` and given losses, in order."""
        if not self._given and tuple not in set(map(type, records)):
            self.tick.extend(records)
            return
        for record in records:
            if type(record) is tuple:  # given to a framework's backward(loss)
                self.tick.append(record[0])
                self._given = self._given_seen = True
            elif self._given:  # the backward() inside the framework's: not the loss
                self._given = False
            else:
                self.tick.append(record)

    def take_latest(self, loss: Any) -> None:
        """The latest tensor backward() was called on, while only the latest is kept."""
        if loss is self._latest_read:
            return  # no backward() since the last tick
        self._latest_read = loss
        if self._given_seen:  # the framework's own backward(): the loss given is the loss
            self._given = False
            return
        self.tick.append(loss)

    def pop(self) -> list[Any]:
        tick, self.tick = self.tick, []
        return tick


class LossUnits:
    """Whether the loss sums over the batch, read once from the first loss tensor whose
    reduction can be told (agent thread); ``notes`` labels a summed one for the metrics."""

    def __init__(self) -> None:
        self.notes: dict[str, str] = {}  # {"loss": SUMMED} once a summed loss was read
        self._known = False

    def read(self, losses: list[Any], step: int) -> Event | None:
        """The event that says the loss is summed, the first time it is read; else None."""
        if self._known or not losses or (reduction := reduction_of(losses[0])) is None:
            return None
        self._known = True
        if reduction != "sum":
            return None
        self.notes["loss"] = SUMMED
        return Event(time.time(), step, "loss_units", SUMMED_SAID, data={"loss": SUMMED})


def reduction_of(loss: Any) -> str | None:
    """``"sum"`` when ``loss``'s graph ends in reductions that all sum over their input
    (``reduction='sum'``, ``torch.sum``) joined by +, - and ×, ``"mean"`` when they all
    average, None when that cannot be told (no graph, a division, another operation)."""
    stack = [getattr(loss, "grad_fn", None)]
    found: set[str] = set()
    seen = 0
    while stack:
        node = stack.pop()
        if node is None:
            continue  # a constant term (AMP's scale, a weight)
        seen += 1
        name = type(node).__name__
        kind = _REDUCTIONS.get(name) or _SAVED_REDUCTION.get(getattr(node, "_saved_reduction", 0))
        if kind is not None:
            found.add(kind)
        elif name in _JOINS and seen < _MAX_NODES:
            stack.extend(following for following, _ in node.next_functions)
        else:
            return None
    return found.pop() if len(found) == 1 else None
