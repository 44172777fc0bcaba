"""The agent's Unix-socket server: many clients, NDJSON both ways, nothing reaches the job.

It runs on the agent thread's asyncio loop. Each client gets the greeting (hello, history,
recent events) and then every broadcast. A client that reads slowly loses ``metrics`` lines
while its unsent output is above ``SLOW_CLIENT_BYTES`` (the next metrics it gets count them in
``dropped``); one that loses ``MAX_CONSECUTIVE_DROPS`` in a row, or whose unsent output passes
``STALLED_CLIENT_BYTES``, is disconnected. Replies, events and the greeting are never dropped.
A line over 1 MiB closes only its own connection. Serving is paced (``pacing.WorkBudget``): a
client flooding the socket is held back rather than served at the job's expense.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from . import protocol
from .pacing import WorkBudget

SLOW_CLIENT_BYTES = 1 << 20
STALLED_CLIENT_BYTES = 16 << 20
MAX_CONSECUTIVE_DROPS = 240  # about a minute of metrics at 4 Hz
BACKLOG = 256  # connections the kernel holds while serving is paced
ACCEPT_BATCH = 64
_PEERCRED = struct.Struct("3i")


def peer_uid(sock: socket.socket) -> int | None:
    """The connecting process's uid (SO_PEERCRED), or None where the OS cannot say."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, option, _PEERCRED.size)
    return _PEERCRED.unpack(raw)[1]


@dataclass(eq=False)
class ClientConnection:
    writer: asyncio.StreamWriter
    dropped: int = 0
    consecutive_drops: int = 0
    sent_lines: int = 0
    closed: bool = field(default=False)

    def pending_bytes(self) -> int:
        return self.writer.transport.get_write_buffer_size()

    def gone(self) -> bool:
        """Closed by us, or the peer went away (a write failed, the connection was lost)."""
        return self.closed or self.writer.transport.is_closing()

    def send(self, line: bytes) -> None:
        # A write to a lost connection is dropped by asyncio with a logged warning each time.
        if not self.gone():
            self.writer.write(line)
            self.sent_lines += 1

    def close(self, abort: bool = False) -> None:
        """Close after flushing, or at once (``abort``) for a peer that stopped reading."""
        if not self.closed:
            self.closed = True
            if abort:
                self.writer.transport.abort()
            else:
                self.writer.close()


async def close_with_notice(
    writer: asyncio.StreamWriter, message: str, unread: asyncio.StreamReader | None = None
) -> None:
    """Tell the peer why, give it a second to read it, and close. With ``unread``, the rest of
    what the peer is still sending is read and dropped first: a Unix socket closed with unread
    input resets the peer, which then loses the notice."""
    writer.write(protocol.encode(protocol.Notice(message=message, closing=True)))
    with contextlib.suppress(Exception):
        await asyncio.wait_for(writer.drain(), timeout=1.0)
        if unread is not None:
            writer.write_eof()
            await asyncio.wait_for(_discard(unread), timeout=1.0)
    writer.close()


async def _discard(reader: asyncio.StreamReader) -> None:
    while await reader.read(1 << 16):
        pass


class _NotFromThread(logging.Filter):
    def __init__(self, thread_id: int) -> None:
        super().__init__()
        self.thread_id = thread_id

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread != self.thread_id


@contextlib.contextmanager
def asyncio_logs_kept_from_the_job() -> Iterator[None]:
    """Nothing the ``asyncio`` logger logs on this thread (bsmon's agent thread) gets out while
    inside. With no logging configured, the logging module's last resort prints on the
    process's stderr, the job's; a job that configured logging would get it in its own log."""
    logger = logging.getLogger("asyncio")
    quiet = _NotFromThread(threading.get_ident())
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


LineHandler = Callable[[bytes], bytes]
Greeting = Callable[[], list[bytes]]


class AgentServer:
    """Serves one socket path. All methods run on the agent loop's thread."""

    def __init__(
        self,
        path: Path,
        handle_line: LineHandler,
        greeting: Greeting,
        *,
        allowed_uid: int | None = None,
    ) -> None:
        self.path = path
        self._handle_line = handle_line
        self._greeting = greeting
        self._allowed_uid = os.getuid() if allowed_uid is None else allowed_uid
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task | None = None
        self.budget = WorkBudget()
        self.clients: set[ClientConnection] = set()
        self._tasks: set[asyncio.Task] = set()
        self.refused_peers = 0

    async def start(self) -> None:
        """Listen on ``path``; again after the file was deleted (the old listener is closed)."""
        # Bound and listening under a hidden name first, then renamed into place: a socket
        # file that exists always accepts (a client never meets one that refuses).
        staging = self.path.with_name(f".{self.path.name}~")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with contextlib.suppress(FileNotFoundError):
                staging.unlink()
            sock.bind(os.fspath(staging))
            os.chmod(staging, 0o600)
            sock.listen(BACKLOG)
            sock.setblocking(False)
            os.replace(staging, self.path)
        except BaseException:
            sock.close()
            with contextlib.suppress(FileNotFoundError):
                staging.unlink()
            raise
        self._stop_listening()
        self._listener = sock
        self._accepting = asyncio.get_running_loop().create_task(self._accept(sock))

    def _stop_listening(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
        if self._listener is not None:
            self._listener.close()

    async def _accept(self, listener: socket.socket) -> None:
        """Accept connections a burst at a time, paced: while the budget is spent, a flood of
        connects waits in the kernel's backlog instead of in the job's time."""
        loop = asyncio.get_running_loop()
        while True:
            await self.budget.pace()
            try:
                waiting = [await loop.sock_accept(listener)]
            except OSError:
                if listener.fileno() < 0:
                    return  # closed: stop, or a rebind
                await asyncio.sleep(0.1)  # out of descriptors or memory: try again shortly
                continue
            with contextlib.suppress(OSError):  # the burst is over (or out of descriptors)
                while len(waiting) < ACCEPT_BATCH:
                    waiting.append(listener.accept())
            for conn, _ in waiting:
                task = loop.create_task(self._serve_socket(conn))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _serve_socket(self, conn: socket.socket) -> None:
        try:
            reader, writer = await asyncio.open_unix_connection(
                sock=conn, limit=protocol.MAX_LINE_BYTES + 1
            )
        except OSError:
            conn.close()
            return
        await self._serve_client(reader, writer)

    def socket_missing(self) -> bool:
        """Whether the socket file was deleted under the running job (nobody can connect)."""
        return not os.path.lexists(self.path)

    async def stop(self, farewell: bytes | None = None) -> None:
        self._stop_listening()
        for client in list(self.clients):
            if farewell:
                client.send(farewell)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.writer.drain(), timeout=0.5)
            client.close()
        if self._tasks:  # closed transports end their readers with EOF
            _, late = await asyncio.wait(list(self._tasks), timeout=1.0)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=1.0)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def broadcast_metrics(self, metrics: protocol.Metrics) -> None:
        """Metrics are droppable; a client that lost some learns how many in the next one."""
        shared = protocol.encode(metrics)
        for client in list(self.clients):
            if client.dropped and client.pending_bytes() <= SLOW_CLIENT_BYTES:
                own = msgspec.structs.replace(metrics, dropped=client.dropped)
                client.dropped = 0
                self._send_droppable(client, protocol.encode(own))
            else:
                self._send_droppable(client, shared)

    def broadcast(self, line: bytes, *, droppable: bool) -> None:
        for client in list(self.clients):
            if droppable:
                self._send_droppable(client, line)
            elif not self._close_if_stalled(client):
                client.send(line)

    def _send_droppable(self, client: ClientConnection, line: bytes) -> None:
        if self._close_if_stalled(client):
            return
        if client.pending_bytes() > SLOW_CLIENT_BYTES:
            client.dropped += 1
            client.consecutive_drops += 1
            if client.consecutive_drops >= MAX_CONSECUTIVE_DROPS:
                client.close(abort=True)
                self.clients.discard(client)
        else:
            client.consecutive_drops = 0
            client.send(line)

    def _close_if_stalled(self, client: ClientConnection) -> bool:
        if client.pending_bytes() <= STALLED_CLIENT_BYTES:
            return False
        client.close(abort=True)
        self.clients.discard(client)
        return True

    async def _serve_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        sock = writer.get_extra_info("socket")
        uid = peer_uid(sock) if sock is not None else None
        if uid is not None and uid != self._allowed_uid:
            self.refused_peers += 1
            await close_with_notice(
                writer, f"refused: peer uid {uid} is not the job's uid {self._allowed_uid}"
            )
            return
        client = ClientConnection(writer)
        try:
            greeting = self._greeting()
        except Exception as exc:  # a bug here must not take the server down
            greeting = [
                protocol.encode(
                    protocol.Notice(
                        message=f"bsmon could not build its greeting: {type(exc).__name__}: {exc}"
                    )
                )
            ]
        for line in greeting:
            client.send(line)
        self.clients.add(client)
        try:
            await self._read_commands(reader, client)
        except asyncio.CancelledError:
            pass  # shutdown; ending quietly keeps asyncio from logging it as an error
        finally:
            self.clients.discard(client)
            client.close()

    async def _read_commands(self, reader: asyncio.StreamReader, client: ClientConnection) -> None:
        while not client.gone():  # lines a gone peer left buffered are not answered
            try:
                line = await reader.readuntil(b"\n")
            except asyncio.IncompleteReadError:
                return  # EOF; a half line without a newline is not a command
            except asyncio.LimitOverrunError:
                client.closed = True  # the notice below is the last line it gets
                await close_with_notice(
                    client.writer,
                    f"closing: a line longer than {protocol.MAX_LINE_BYTES} bytes",
                    unread=reader,
                )
                return
            except (ConnectionError, OSError):
                return
            if line.strip():
                client.send(self._handle_line(line))
            await self.budget.pace()
