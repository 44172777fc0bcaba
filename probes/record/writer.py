"""The record writer: where a record goes, and the thread that does all of its file I/O.

``RecordWriter`` appends and flushes each line as it comes (so a killed job loses at most the
open half second), compacts the file as it grows, and writes the ``end`` line when the
session closes (whoever closes it then writes the summary beside the record). A failing disk
never reaches the job: the writer stops recording and reports an event.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from ..wire import discovery
from ..wire.protocol import Event, SessionInfo
from .buckets import compact
from .format import (
    End,
    Span,
    encode_line,
    header_for,
)

if TYPE_CHECKING:
    pass

RECORDS_SUBDIR = "records"
MAX_PENDING_LINES = 10_000  # lines waiting for a stuck disk before recording stops
CLOSE_TIMEOUT_S = 15.0
_claimed: set[Path] = set()  # record paths given out in this process
_claimed_lock = threading.Lock()
_CLOSE = object()


NAME_CHARS = 40  # of the job's name in a record's file name


def default_record_path(records: Path, name: str, start: float, pid: int) -> Path:
    """``<records>/<YYYYmmdd-HHMMSS>-<name>-<pid>.jsonl``; a long name is cut in its middle,
    so that a rank's suffix (``-rank1``) stays."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(start))
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name) or "job"
    if len(safe) > NAME_CHARS:
        tail = re.search(r"-rank\d+$", safe)
        keep = tail.group() if tail else ""
        safe = safe[: NAME_CHARS - len(keep)] + keep
    return records / f"{stamp}-{safe}-{pid}.jsonl"


def claim_record_path(path: Path) -> Path:
    """``path``, or ``<stem>-2.jsonl``, ``-3``… when it exists or this process already gave
    it to another monitor (whose writer may not have created it yet)."""
    suffix = ".jsonl" if path.name.endswith(".jsonl") else ""
    stem = path.name.removesuffix(suffix)
    with _claimed_lock:  # one stat per candidate, at attach (setup), never per step
        for serial in range(1, 10_000):
            candidate = path if serial == 1 else path.with_name(f"{stem}-{serial}{suffix}")
            if candidate not in _claimed and not os.path.lexists(candidate):
                _claimed.add(candidate)
                return candidate
    return path  # the writer's exclusive open will report it


class RecordWriter(threading.Thread):
    """Owns the record file: appends, flushes, compacts, and ends it."""

    def __init__(
        self,
        path: Path,
        report: Callable[[str], None],
        *,
        start: float,
        bucket_s: float,
        per_level: int,
        private_dir: Path | None = None,
        before: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(name="bsmon-record", daemon=True)
        self.path = path
        self._report = report
        self._start = start
        self._bucket_s = bucket_s
        self._per_level = per_level
        self._private_dir = private_dir
        self._before = before
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._file: Any = None
        self._spans_since_compaction = 0
        self._last_t1 = start
        self.failed: str | None = None
        self.compactions = 0
        self.done = threading.Event()

    # -- any thread ---------------------------------------------------------------------------

    def put(self, line: bytes, span_end: float | None = None) -> None:
        """Queue one encoded line; ``span_end`` is the ``t1`` of a span line."""
        if self.failed is not None:
            return
        if self._queue.qsize() > MAX_PENDING_LINES:
            self.fail(f"recording stopped: the disk did not keep up with {self.path}")
            return
        self._queue.put((line, span_end))

    def fail(self, message: str) -> None:
        if self.failed is None:
            self.failed = message
            self._report(message)

    def finish(self, timeout: float) -> bool:
        self._queue.put(_CLOSE)
        if self.is_alive():
            self.join(timeout)
        return self.done.is_set() and self.failed is None

    def append_last_word(self, line: bytes) -> bool:
        """After a failure and once the thread is done: one try to end the record with
        ``line``, for a disk that has room again (or was only slow). A torn last line is cut
        off first, so the record still reads; a line that does not fit whole is taken back."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW)
        except OSError:
            return False  # never made (a read-only directory), or gone
        try:
            whole = _whole_lines_size(fd)
            os.ftruncate(fd, whole)
            written = os.write(fd, line)  # a write that raises wrote nothing
            if written != len(line):
                os.ftruncate(fd, whole)
            return written == len(line)
        except OSError:
            return False
        finally:
            os.close(fd)

    # -- the thread ---------------------------------------------------------------------------

    def run(self) -> None:
        if self._before is not None:
            with contextlib.suppress(Exception):
                self._before()
        try:
            self._open()
            while self._write_batch():
                pass
        except Exception as exc:
            self._close_file()
            self.fail(f"recording stopped: cannot write {self.path}: {describe_os_error(exc)}")
            self._drain()
            return
        self._close_file(sync=True)
        self.done.set()

    def _open(self) -> None:
        if self._private_dir is not None:
            discovery.ensure_private_dir(self._private_dir.parent)
            discovery.ensure_private_dir(self._private_dir)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        self._file = os.fdopen(fd, "ab")

    def _write_batch(self) -> bool:
        """Write what is queued (waiting for the first line); False once closed."""
        item = self._queue.get()
        while True:
            if item is _CLOSE:
                self._file.flush()
                return False
            line, span_end = item
            self._file.write(line)
            if span_end is not None:
                self._spans_since_compaction += 1
                self._last_t1 = max(self._last_t1, span_end)
                if self._spans_since_compaction >= self._per_level:
                    self._compact()
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
        self._file.flush()
        return True

    def _compact(self) -> None:
        """Rewrite the record with old spans merged, then go on appending to the new file."""
        self._spans_since_compaction = 0
        self._file.flush()
        fd, tmp = discovery.create_temp_beside(self.path)
        dst = os.fdopen(fd, "wb")
        try:
            with open(self.path, "rb") as src:
                items = compact(
                    _own_lines(src),
                    start=self._start,
                    now=self._last_t1,
                    bucket_s=self._bucket_s,
                    per_level=self._per_level,
                )
                for item in items:
                    dst.write(item if isinstance(item, bytes) else encode_line(item))  # type: ignore[arg-type]
            dst.flush()
            os.fsync(dst.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                dst.close()
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        self._file.close()
        self._file = dst  # appended to from here: the path is never opened again to write
        self.compactions += 1

    def _close_file(self, sync: bool = False) -> None:
        file, self._file = self._file, None
        if file is None:
            return
        with contextlib.suppress(OSError):
            file.flush()
            if sync:
                os.fsync(file.fileno())
        with contextlib.suppress(OSError):
            file.close()

    def _drain(self) -> None:
        """After a failure: keep emptying the queue until closed, so nothing piles up."""
        while self._queue.get() is not _CLOSE:
            pass
        self.done.set()


def write_unattached(records: Path, session: SessionInfo, reason: str) -> Path:
    """The record of a process bsmon could not attach to: its session, why, and its end (its
    summary beside it lets ``bsmon export`` and ``replay`` say why too)."""
    now = time.time()
    message = f"bsmon did not attach: {reason}"
    lines = (
        header_for(session, None, now),
        Event(t=now, step=0, kind="not_attached", message=message, level="warning"),
        End(t=now, reason=message, step=0, samples=0),
    )
    path = claim_record_path(
        default_record_path(records, session.name, session.start_time, session.pid)
    )
    discovery.ensure_private_dir(path.parent)
    with open(path, "xb") as f:
        f.write(b"".join(encode_line(line) for line in lines))
    return path


_span_decoder = msgspec.json.Decoder(Span)
_SPAN_PREFIX = b'{"type":"span"'


def _own_lines(src: Any) -> Iterator[Span | bytes]:
    """The lines of a record this writer wrote: spans decoded, the rest as they are."""
    for line in src:
        if not line.endswith(b"\n"):
            continue  # cannot happen in our own file, but never copy half a line
        yield _span_decoder.decode(line) if line.startswith(_SPAN_PREFIX) else line


def _whole_lines_size(fd: int, chunk: int = 1 << 16) -> int:
    """The size of the file up to the end of its last whole line."""
    size = os.fstat(fd).st_size
    end = size
    while end > 0:
        start = max(0, end - chunk)
        newline = os.pread(fd, end - start, start).rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0


def describe_os_error(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
