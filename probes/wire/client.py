"""A small blocking client for the bsmon protocol (used by the dashboard, the CLI and tests).

``JobConnection.pump()`` does all socket I/O with ``select``, so one thread can both read the
stream and send commands without ever blocking on either.
"""

from __future__ import annotations

import itertools
import os
import select
import socket
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from . import protocol
from .protocol import Command, Hello, Message, Reply

MAX_SERVER_LINE = 64 << 20


class ConnectionLost(ConnectionError):
    """The job closed the connection (or went away)."""


class JobConnection:
    def __init__(self, path: Path | str, timeout: float = 5.0) -> None:
        self.path = Path(path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(os.fspath(self.path))
        except OSError as exc:
            self._sock.close()
            reason = exc.strerror or str(exc)
            raise ConnectionError(f"cannot connect to {self.path}: {reason}") from None
        self._sock.setblocking(False)
        self._inbuf = bytearray()
        self._outbuf = bytearray()
        self._ids = itertools.count(1)
        self._unclaimed: deque[Message] = deque()
        self.eof = False
        self.undecodable = 0

    def fileno(self) -> int:
        return self._sock.fileno()

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> JobConnection:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def send(self, command: Command) -> protocol.CommandId:
        """Queue a command (given an id if it has none); ``pump`` writes it."""
        if command.id is None:
            command.id = next(self._ids)
        self._outbuf += protocol.encode(command)
        return command.id

    def send_raw(self, line: bytes) -> None:
        """Queue raw bytes as they are (tests of bad input use this)."""
        self._outbuf += line

    def pump(self, timeout: float = 0.1) -> list[Message]:
        """Write what is queued, read what has arrived, return the decoded messages."""
        if self.eof:
            raise ConnectionLost(f"connection to {self.path} closed")
        writers = [self._sock] if self._outbuf else []
        readable, writable, _ = select.select([self._sock], writers, [], timeout)
        if writable:
            self._write()
        if readable:
            self._read()
        return self._decode_lines()

    def _write(self) -> None:
        try:
            sent = self._sock.send(self._outbuf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.eof = True
            raise ConnectionLost(f"connection to {self.path} lost: {exc}") from None
        del self._outbuf[:sent]

    def _read(self) -> None:
        try:
            chunk = self._sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.eof = True
            return
        self._inbuf += chunk
        if len(self._inbuf) > MAX_SERVER_LINE and b"\n" not in self._inbuf:
            self.eof = True
            raise ConnectionLost(f"{self.path} sent a line longer than {MAX_SERVER_LINE} bytes")

    def _decode_lines(self) -> list[Message]:
        messages: list[Message] = []
        while (end := self._inbuf.find(b"\n")) >= 0:
            line = bytes(self._inbuf[:end])
            del self._inbuf[: end + 1]
            try:
                message = protocol.decode_server_message(line)
            except protocol.ProtocolError:
                self.undecodable += 1
                continue
            if message is not None:
                messages.append(message)
        return messages

    def messages(self, timeout: float) -> list[Message]:
        """Messages received within ``timeout`` seconds (also those set aside by ``request``)."""
        out = list(self._unclaimed)
        self._unclaimed.clear()
        deadline = time.monotonic() + timeout
        while not self.eof:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            out.extend(self.pump(min(remaining, 0.1)))
        return out

    def wait_for(self, kind: type[Message], timeout: float = 5.0) -> Message:
        """The next message of ``kind``; the others are kept for ``messages``."""
        return self._wait(lambda m: isinstance(m, kind), kind.__name__.lower(), timeout)

    def wait_matching(
        self, wanted: Callable[[Message], bool], what: str, timeout: float = 5.0
    ) -> Message:
        """The next message ``wanted`` accepts (``what`` names it if none comes in time)."""
        return self._wait(wanted, what, timeout)

    def _wait(self, wanted: Callable[[Message], bool], what: str, timeout: float) -> Message:
        deadline = time.monotonic() + timeout
        while True:
            for i, message in enumerate(self._unclaimed):
                if wanted(message):
                    del self._unclaimed[i]
                    return message
            if self.eof:
                raise ConnectionLost(f"connection to {self.path} closed")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {what} from {self.path} within {timeout:.1f}s")
            self._unclaimed.extend(self.pump(min(0.1, remaining)))

    def hello(self, timeout: float = 5.0) -> Hello:
        return self.wait_for(Hello, timeout)  # type: ignore[return-value]

    def request(self, command: Command, timeout: float = 5.0) -> Reply:
        """Send a command and wait for its reply; other messages are kept for later."""
        command_id = self.send(command)
        reply = self._wait(
            lambda m: isinstance(m, Reply) and m.id == command_id,
            f"reply to {command_id!r}",
            timeout,
        )
        return reply  # type: ignore[return-value]
