"""The session recorder: spans built on the agent thread, written by a writer thread.

``Recorder`` is fed on the agent thread (never the training thread): every resolved step and
scalar through the telemetry tap, and once per tick the new events and the latest device
sample. Every ``BUCKET_S`` of wall time (or when the batch size changes) it closes a span
and hands the encoded line to ``RecordWriter``, a thread of its own that does all the file
I/O: it appends and flushes each line as it comes (so a killed job loses at most the open
half second), compacts the file as it grows, and, when the monitor closes, writes the
``end`` line and the summary beside the record. A failing disk never reaches the job: the
writer stops recording and reports an event.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from ..runtime.service import Extension, TickDone
from ..wire import discovery
from ..wire.protocol import Capability, Event, SessionInfo
from .buckets import StatAcc, compact, single, step_bin
from .conversions import device_span
from .format import (
    BUCKET_S,
    PER_LEVEL,
    DeviceSpan,
    End,
    HostSpan,
    PhaseTotals,
    ProbeResult,
    Span,
    Status,
    StepDone,
    encode_line,
    header_for,
    throughput,
)

if TYPE_CHECKING:
    from ..runtime.devices import DeviceSample
    from ..runtime.telemetry import Telemetry

RECORDS_SUBDIR = "records"
MAX_PENDING_LINES = 10_000  # lines waiting for a stuck disk before recording stops
CLOSE_TIMEOUT_S = 15.0
_claimed: set[Path] = set()  # record paths given out in this process
_claimed_lock = threading.Lock()
_CLOSE = object()


def default_record_path(base: Path, name: str, start: float, pid: int) -> Path:
    """``<base>/records/<YYYYmmdd-HHMMSS>-<name>-<pid>.jsonl``."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(start))
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:40] or "job"
    return base / RECORDS_SUBDIR / f"{stamp}-{safe}-{pid}.jsonl"


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


class _Bucket:
    """The open span (agent thread)."""

    __slots__ = (
        "batch_size",
        "eval_s",
        "hist",
        "phases",
        "scalars",
        "step_time",
        "steps",
        "t0",
        "timed_s",
        "timed_samples",
        "timed_steps",
        "uncounted_s",
    )

    def __init__(self, t0: float, batch_size: int | None) -> None:
        self.t0 = t0
        self.batch_size = batch_size
        self.steps = 0
        self.timed_steps = 0
        self.timed_s = 0.0
        self.timed_samples = 0
        self.uncounted_s = 0.0  # timed seconds of steps whose samples were not counted
        self.eval_s = 0.0
        self.step_time = StatAcc()
        self.hist: dict[int, int] = {}
        self.scalars: dict[str, StatAcc] = {}
        self.phases = PhaseTotals()


class Recorder(Extension):
    """Builds spans from what the agent thread sees; ``RecordWriter`` puts them on disk.

    An extension of the agent: it reads every tick's events and device sample, and (as the
    telemetry's tap) every step. Whoever closes the session writes the summary afterwards."""

    def __init__(
        self,
        path: Path,
        session: SessionInfo,
        telemetry: Telemetry,
        emit_event: Callable[[Event], None],
        *,
        private_dir: Path | None = None,
        bucket_s: float = BUCKET_S,
        per_level: int = PER_LEVEL,
        before: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``before``: run first on the writer thread (an import to get done early)."""
        self.path = path
        self.telemetry = telemetry
        telemetry.tap = self
        self.bucket_s = bucket_s
        self._start = session.start_time
        self._clock = clock
        self._emit_event = emit_event
        self.writer = RecordWriter(
            path,
            self._report_failure,
            start=session.start_time,
            bucket_s=bucket_s,
            per_level=per_level,
            private_dir=private_dir,
            before=before,
        )
        self.writer.put(encode_line(header_for(session, telemetry.batch_size, clock())))
        self.step = 0
        self.samples = 0
        self._bucket = _Bucket(session.start_time, telemetry.batch_size)
        self._status: tuple[Capability, Capability] | None = None
        self._last_sample: DeviceSample | None = None
        self._closed = False

    @property
    def failed(self) -> str | None:
        return self.writer.failed

    def start(self) -> None:
        self.writer.start()

    # -- the telemetry tap (agent thread) -----------------------------------------------------

    def on_step(self, done: StepDone) -> None:
        try:
            step, duration, samples, batch_size, eval_s, phases = done
            bucket = self._bucket
            if bucket.batch_size != batch_size:
                if bucket.steps:  # a span has one batch size: a change closes it
                    self._close_bucket(self._clock())
                    bucket = self._bucket
                bucket.batch_size = batch_size
            bucket.steps += 1
            bucket.eval_s += eval_s
            self.step = step
            if samples is not None:
                self.samples += samples
            if duration is not None and 0 < duration < math.inf:
                bucket.timed_steps += 1
                bucket.timed_s += duration
                if samples is None:
                    bucket.uncounted_s += duration
                else:
                    bucket.timed_samples += samples
                bucket.step_time.add(duration)
                if phases is not None:
                    bucket.phases.add(duration, phases)
                index = step_bin(duration)
                bucket.hist[index] = bucket.hist.get(index, 0) + 1
        except Exception as exc:  # never into the agent's tick
            self._internal_error(exc)

    def on_scalar(self, name: str, value: float) -> None:
        try:
            acc = self._bucket.scalars.get(name)
            if acc is None:
                acc = self._bucket.scalars[name] = StatAcc()
            acc.add(value)
        except Exception as exc:
            self._internal_error(exc)

    def _internal_error(self, exc: Exception) -> None:
        self.telemetry.tap = None
        self.writer.fail(f"internal error in the recorder ({type(exc).__name__}: {exc})")

    # -- each tick (agent thread) -------------------------------------------------------------

    def after_tick(self, done: TickDone) -> None:
        self.tick(done.t, done.events, done.sample, done.noise_scale, done.final)

    def tick(
        self,
        now: float,
        events: list[Event],
        sample: DeviceSample,
        noise_capability: Capability,
        final: bool = False,
    ) -> None:
        if self._closed or self.writer.failed:
            if self.telemetry.tap is self:
                self.telemetry.tap = None  # nothing more to record: stop spending on steps
            return
        try:
            for event in events:
                self.writer.put(encode_line(event))
            status = (sample.gpu, noise_capability)
            if status != self._status:
                self._status = status
                self.writer.put(encode_line(Status(t=now, gpu=sample.gpu, noise_scale=status[1])))
            if final or self._cell(now) != self._cell(self._bucket.t0):
                self._close_bucket(now, sample)
        except Exception as exc:  # a bug here must end only the recording
            self._internal_error(exc)

    def _cell(self, t: float) -> int:
        return math.floor((t - self._start) / self.bucket_s)

    def _close_bucket(self, now: float, sample: DeviceSample | None = None) -> None:
        bucket = self._bucket
        devices: list[DeviceSpan] = []
        host = None
        if sample is not None and sample is not self._last_sample:  # a fresh reading
            self._last_sample = sample
            devices = [device_span(d) for d in sample.devices]
            host = HostSpan(cpu=single(sample.host.cpu_percent), rss=single(sample.host.rss_bytes))
        noise = self.telemetry.noise
        span = Span(
            t0=bucket.t0,
            t1=max(now, bucket.t0),
            step=self.step,
            steps=bucket.steps,
            samples=self.samples,
            batch_size=bucket.batch_size,
            timed_steps=bucket.timed_steps,
            timed_s=bucket.timed_s,
            timed_samples=bucket.timed_samples,
            uncounted_s=bucket.uncounted_s,
            eval_s=bucket.eval_s,
            step_time=bucket.step_time.stat(),
            step_hist=bucket.hist,
            throughput=single(throughput(bucket.timed_samples, bucket.timed_s, bucket.uncounted_s)),
            scalars={name: acc.stat() for name, acc in bucket.scalars.items()},  # type: ignore[misc]
            b_simple=single(noise.b_simple),
            b_simple_at_least=noise.lower_bound if noise.b_simple is None else None,
            noise_steps=noise.samples or None,
            phases=bucket.phases if bucket.phases.steps else None,
            devices=devices,
            host=host,
        )
        self.writer.put(encode_line(span), span_end=span.t1)
        self._bucket = _Bucket(now, bucket.batch_size)

    # -- any thread ---------------------------------------------------------------------------

    def probe(self, result: dict[str, Any], step: int) -> None:
        """Record a probe result (any thread; never raises)."""
        try:
            line = encode_line(ProbeResult(t=self._clock(), step=step, result=dict(result)))
        except Exception as exc:
            self._report_failure(f"a probe result could not be recorded: {exc}", stopped=False)
            return
        self.writer.put(line)

    def close(self, reason: str, step: int, timeout: float = CLOSE_TIMEOUT_S) -> bool:
        """Write the ``end`` line and close the file; True when all was done (then the record
        is whole, and its summary can be written)."""
        if self._closed:
            return False
        self._closed = True
        end = End(t=self._clock(), reason=reason, step=max(step, self.step), samples=self.samples)
        self.writer.put(encode_line(end))
        return self.writer.finish(timeout)

    def _report_failure(self, message: str, stopped: bool = True) -> None:
        self._emit_event(
            Event(
                t=time.time(),
                step=self.step,
                kind="record_error",
                level="warning",
                message=message + ("; the job goes on unrecorded" if stopped else ""),
                data={"path": str(self.path)},
            )
        )


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
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with open(self.path, "rb") as src, os.fdopen(fd, "wb") as dst:
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
                tmp.unlink()
            raise
        self._file.close()
        self._file = open(self.path, "ab")  # noqa: SIM115 - kept open across batches
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


def write_unattached(base: Path, session: SessionInfo, reason: str) -> Path:
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
        default_record_path(base, session.name, session.start_time, session.pid)
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


def describe_os_error(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
