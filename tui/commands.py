"""Commands the dashboard sends to the job, and what to tell the user about each reply.

Ids are assigned here (``ui-1``, ``ui-2``, ...) so a reply can be matched to its command on
the UI thread. Nothing here imports textual: the screen turns an ``Outcome`` into a
notification or a confirmation dialog.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Literal

from bsmon.probes.wire.protocol import (
    CLIENT_COMMANDS,
    AutopilotCommand,
    BatchSizeResult,
    Command,
    ProbeCommand,
    Reply,
    SetBatchSize,
    StepBatchSize,
)

from .sources import Source


@dataclass(frozen=True)
class Outcome:
    kind: Literal["done", "refused", "confirm"]
    message: str
    retry: Command | None = None  # for "confirm": the command to send if the user agrees


class CommandDesk:
    def __init__(self, source: Source, readonly: bool) -> None:
        self._source = source
        self.readonly = readonly
        self._ids = itertools.count(1)
        self._sent: dict[str, Command] = {}

    def send(self, command: Command) -> str:
        if self.readonly:
            raise PermissionError("the monitor is read-only (--readonly)")
        command.id = f"ui-{next(self._ids)}"
        self._sent[command.id] = command
        self._source.send(command)
        return command.id

    def answer(self, reply: Reply) -> Outcome | None:
        """What a reply means for the user; None for replies to commands not sent from here."""
        command = self._sent.pop(str(reply.id), None) if reply.id is not None else None
        error = user_words(reply.error or "refused")
        if command is None:
            return None if reply.ok else Outcome("refused", error)
        result = BatchSizeResult.of(reply)
        if reply.ok:
            return Outcome("done", describe_success(command, result))
        if result.needs_confirmation and result.value is not None:
            retry = SetBatchSize(
                value=result.value,
                confirm=True,
                reason=getattr(command, "reason", "") or "confirmed",
            )
            return Outcome("confirm", user_words(str(result.why or error)), retry)
        return Outcome("refused", error)


def user_words(error: str) -> str:
    """A refusal as a person reads it: without the command's wire name in front
    ("step_batch_size: 1 is already the smallest..." -> "1 is already the smallest...")."""
    kind, sep, rest = error.partition(": ")
    return rest if sep and kind in CLIENT_COMMANDS and rest else error


def describe_success(command: Command, result: BatchSizeResult) -> str:
    if isinstance(command, (SetBatchSize, StepBatchSize)):
        when = result.applies_at or f"after step {result.applies_after_step}"
        return f"batch size {result.old} → {result.new} {when}"
    if isinstance(command, ProbeCommand):
        return "probe started: it runs in a separate process beside the job"
    if isinstance(command, AutopilotCommand):
        if command.on:
            return "autopilot on: it grows the batch as the noise scale allows (a again: off)"
        return "autopilot off: the batch stays where it is"
    return "done"
