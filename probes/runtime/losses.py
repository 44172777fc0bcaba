"""Which tensors are the loss (agent thread): the scalars ``backward()`` was called on
(``bsmon run``), unless a framework gave its loss first (``mon.loss_given``: accelerate's
``backward(loss)``), whose own ``backward()`` on a scaled copy is then not the loss.

The inbox brings them in order (``Inbox.losses``: a tensor, or ``(loss,)`` for a given
one), or, while the loop is fast, only the latest tensor (``Inbox.latest_loss``).
"""

from __future__ import annotations

from typing import Any


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
