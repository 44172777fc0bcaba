"""Where the dashboard's data comes from: a live job's socket, or a scripted sequence.

A source runs on a worker thread (``run``), feeds protocol messages to a ``SessionModel``
and hands ``Update``s to a callback; the app turns those into Textual messages. The UI thread
only ever calls ``send`` (which queues) and ``stop``.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from bsmon.probes.wire import ConnectionLost, JobConnection
from bsmon.probes.wire.protocol import Command, Message, Metrics, Notice, Reply

from .session import SessionModel, Snapshot

UPDATE_INTERVAL_S = 0.25
RETRY_INTERVAL_S = 1.0


@dataclass(frozen=True)
class Update:
    snapshot: Snapshot
    replies: tuple[Reply, ...] = ()
    notices: tuple[Notice, ...] = ()


Emit = Callable[[Update], None]


def _whole(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds)


class Source:
    """Base: a session model plus the plumbing to emit coalesced updates."""

    readonly_reason: str | None = None

    def __init__(self, target: str, clock: Callable[[], float] = time.time) -> None:
        self.model = SessionModel(target, clock)
        self._stop = threading.Event()
        self._outbox: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._silent_mark: int | None = None

    @property
    def target(self) -> str:
        return self.model.target

    def run(self, emit: Emit) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def send(self, command: Command) -> None:
        self._outbox.put(command)

    def snapshot(self) -> Snapshot:
        return self.model.snapshot()

    def _emit_update(self, emit: Emit) -> None:
        model = self.model
        replies, model.replies = tuple(model.replies), []
        notices, model.notices = tuple(model.notices), []
        snapshot = self.snapshot()
        self._silent_mark = _whole(snapshot.silent_s)
        emit(Update(snapshot, replies, notices))

    def _emit_while_silent(self, emit: Emit) -> None:
        """While a live job sends nothing, a snapshot every whole second of it (the header's
        clock and count move): no message would bring one."""
        if _whole(self.model.silent_s()) != self._silent_mark:
            self._emit_update(emit)


class SocketSource(Source):
    """Follows one job: connects, reads, and reconnects when the job comes back.

    ``resolve`` turns the target into a socket path each time, so a job restarted under the
    same name (a new pid, a new socket) is found again.
    """

    def __init__(self, target: str, resolve: Callable[[], Path]) -> None:
        super().__init__(target)
        self._resolve = resolve

    def run(self, emit: Emit) -> None:
        self._emit_update(emit)
        while not self.stopped:
            try:
                path = self._resolve()
                connection = JobConnection(path, timeout=2.0)
            except (LookupError, ConnectionError, OSError) as exc:
                self._note_unreachable(str(exc), emit)
                self._stop.wait(RETRY_INTERVAL_S)
                continue
            with connection:
                self._follow(connection, emit)
            if not self.stopped:
                self._stop.wait(RETRY_INTERVAL_S)

    def _note_unreachable(self, reason: str, emit: Emit) -> None:
        if self.model.hello is None:
            self.model.connecting(f"waiting for {self.target}: {reason}")
        else:
            self.model.disconnected(reason)
        self._emit_update(emit)

    def _follow(self, connection: JobConnection, emit: Emit) -> None:
        last_emit = 0.0
        dirty = False
        while not self.stopped:
            self._flush_outbox(connection)
            try:
                messages = connection.pump(0.1)
            except ConnectionLost as exc:
                messages, lost = [], str(exc)
            else:
                lost = "the job closed the connection" if connection.eof else ""
            urgent = self._feed(messages)
            dirty = dirty or bool(messages)
            now = time.monotonic()
            if lost:
                self.model.disconnected(lost)
                self._emit_update(emit)
                return
            if dirty and (urgent or now - last_emit >= UPDATE_INTERVAL_S):
                self._emit_update(emit)
                last_emit, dirty = now, False
            self._emit_while_silent(emit)

    def _flush_outbox(self, connection: JobConnection) -> None:
        while True:
            try:
                connection.send(self._outbox.get_nowait())
            except queue.Empty:
                return

    def _feed(self, messages: Iterable[Message]) -> bool:
        """Feed the model; True when something should be shown at once (not just metrics)."""
        urgent = False
        for message in messages:
            self.model.feed(message)
            urgent = urgent or not isinstance(message, Metrics)
        return urgent


class ScriptedSource(Source):
    """Feeds a fixed list of messages (tests, screenshots), then optionally disconnects;
    ``push`` feeds more later (a job that speaks again).

    Commands sent to it are kept in ``sent`` and answered with ``reply`` if one is given.
    """

    def __init__(
        self,
        target: str,
        messages: Iterable[Message],
        *,
        clock: Callable[[], float] = time.time,
        disconnect: str | None = None,
        reply: Callable[[Command], Reply] | None = None,
    ) -> None:
        super().__init__(target, clock)
        self._messages = list(messages)
        self._disconnect = disconnect
        self._reply = reply
        self._later: queue.SimpleQueue[Message] = queue.SimpleQueue()
        self.sent: list[Command] = []

    def push(self, *messages: Message) -> None:
        """Feed ``messages`` from the source's thread, as if the job had just sent them."""
        for message in messages:
            self._later.put(message)

    def run(self, emit: Emit) -> None:
        for message in self._messages:
            self.model.feed(message)
        if self._disconnect is not None:
            self.model.disconnected(self._disconnect)
        self._emit_update(emit)
        while not self._stop.wait(0.02):
            if self._answer_commands() | self._feed_later():
                self._emit_update(emit)
            self._emit_while_silent(emit)

    def _answer_commands(self) -> bool:
        answered = False
        while True:
            try:
                command = self._outbox.get_nowait()
            except queue.Empty:
                return answered
            self.sent.append(command)
            if self._reply is not None:
                self.model.feed(self._reply(command))
                answered = True

    def _feed_later(self) -> bool:
        fed = False
        while True:
            try:
                self.model.feed(self._later.get_nowait())
            except queue.Empty:
                return fed
            fed = True
