"""Client commands: decode, route to a handler, always answer with one ``reply`` line.

Handlers run on the agent thread. A command whose feature is not available answers
``ok: false`` with the reason; a handler that raises ``CommandRefused`` answers with its
message; any other exception is answered as an internal error. Nothing propagates.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from . import protocol
from .protocol import Capability, Command, Reply

Handler = Callable[[Command], dict[str, Any] | None]
NOT_YET = "not supported yet"


class CommandRefused(Exception):
    """A command that is well formed but cannot be done; the message goes to the client,
    with ``result`` (if any) as the reply's result."""

    result: dict[str, Any] | None = None


class CommandRouter:
    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {"ping": self._ping}
        self._unavailable: dict[str, str] = {
            kind: NOT_YET for kind in protocol.CLIENT_COMMANDS if kind != "ping"
        }
        self.handled = 0
        self.rejected = 0

    def register(self, kind: str, handler: Handler) -> None:
        if kind not in protocol.CLIENT_COMMANDS:
            raise ValueError(f"unknown command type {kind!r}")
        self._handlers[kind] = handler
        self._unavailable.pop(kind, None)

    def disable(self, kind: str, reason: str) -> None:
        """Answer ``kind`` with ``ok: false`` and ``reason`` (e.g. no control in this job)."""
        self._handlers.pop(kind, None)
        self._unavailable[kind] = reason

    def capabilities(self) -> dict[str, Capability]:
        return {
            kind: Capability(kind not in self._unavailable, self._unavailable.get(kind))
            for kind in protocol.CLIENT_COMMANDS
        }

    def handle_line(self, line: bytes) -> bytes:
        return protocol.encode(self.handle(line))

    def handle(self, line: bytes) -> Reply:
        return self._answer(lambda: protocol.decode_command(line))

    def handle_fields(self, fields: dict[str, Any]) -> Reply:
        """A command given as plain data (the job's own call): a line's checks, no JSON."""
        return self._answer(lambda: protocol.command_of(fields))

    def _answer(self, read: Callable[[], Command]) -> Reply:
        try:
            command = read()
        except protocol.ProtocolError as exc:
            self.rejected += 1
            return Reply(id=exc.command_id, ok=False, error=str(exc))
        except Exception as exc:  # a decoding bug: still one reply, never a raise
            self.rejected += 1
            return Reply(
                id=None,
                ok=False,
                error=f"internal error in bsmon reading the line ({type(exc).__name__}: {exc})",
            )
        return self.dispatch(command)

    def dispatch(self, command: Command) -> Reply:
        """Run a checked command's handler; always one reply, never a raise."""
        kind = type(command).__struct_config__.tag
        if kind in self._unavailable:
            self.rejected += 1
            return Reply(id=command.id, ok=False, error=f"{kind}: {self._unavailable[kind]}")
        try:
            result = self._handlers[kind](command)
        except CommandRefused as exc:
            self.rejected += 1
            return Reply(id=command.id, ok=False, error=f"{kind}: {exc}", result=exc.result)
        except Exception as exc:
            self.rejected += 1
            return Reply(
                id=command.id,
                ok=False,
                error=f"{kind}: internal error in bsmon ({type(exc).__name__}: {exc})",
            )
        self.handled += 1
        return Reply(id=command.id, ok=True, result=result)

    @staticmethod
    def _ping(_command: Command) -> dict[str, Any]:
        return {"pong": True, "t": time.time()}
