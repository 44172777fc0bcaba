"""The session recorder: spans built on the agent thread, handed to the record writer.

``Recorder`` is fed on the agent thread (never the training thread): every resolved step and
scalar through the telemetry tap, and once per tick the new events and the latest device
sample. Every ``BUCKET_S`` of wall time (or when the batch size changes) it closes a span and
hands the encoded line to ``writer.RecordWriter``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from itertools import compress, groupby, repeat
from operator import is_
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from ..anatomy.seconds import PhaseTotals
from ..runtime.service import Extension, TickDone
from ..runtime.steps import StepDone, StepRun
from ..runtime.telemetry import sampled_indices
from ..wire.protocol import (
    Capability,
    Event,
    Metrics,
    NoiseScaleReading,
    SessionInfo,
    ThroughputReading,
)
from .buckets import StatAcc, count_step_bins, single
from .conversions import device_span
from .format import (
    BUCKET_S,
    PER_LEVEL,
    DeviceSpan,
    End,
    HostSpan,
    ProbeLine,
    Span,
    Status,
    encode_line,
    header_for,
    throughput,
)

if TYPE_CHECKING:
    from ..runtime.devices import DeviceSample
    from ..runtime.telemetry import Telemetry
from .writer import CLOSE_TIMEOUT_S, RecordWriter


def _widen(bucket: _Bucket, low: int, high: int) -> None:
    """Steps without one batch size (``NominalBatch``: the examples per step vary): the
    span keeps their least and most examples per step."""
    if bucket.examples_range is not None:
        low, high = min(low, bucket.examples_range[0]), max(high, bucket.examples_range[1])
    bucket.examples_range = (low, high)


class _Bucket:
    """The open span (agent thread)."""

    __slots__ = (
        "batch_size",
        "eval_s",
        "examples_range",
        "first",
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
        self.examples_range: tuple[int, int] | None = None  # no one size: examples per step
        self.steps = 0
        self.timed_steps = 0
        self.timed_s = 0.0
        self.timed_samples = 0
        self.uncounted_s = 0.0  # timed seconds of steps whose samples were not counted
        self.eval_s = 0.0
        self.step_time = StatAcc()
        self.hist: dict[int, int] = {}
        self.scalars: dict[str, StatAcc] = {}
        self.first: dict[str, float] = {}  # scalars logged for the first time in this span
        self.phases = PhaseTotals()


class HasReading(Protocol):
    """The noise scale as the recorder reads it (``noise.NoiseScale``): its latest reading."""

    reading: NoiseScaleReading


class _NoNoise:
    reading = NoiseScaleReading()


_NO_NOISE = _NoNoise()


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
        noise: HasReading | None = None,
        bucket_s: float = BUCKET_S,
        per_level: int = PER_LEVEL,
        before: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.time,
        on_stopped: Callable[[str], None] = lambda _message: None,
    ) -> None:
        """``before``: run first on the writer thread (an import to get done early);
        ``on_stopped``: told (on the writer's thread, once) when the recording stops, beside
        the event."""
        self.path = path
        self.telemetry = telemetry
        telemetry.tap = self
        self.bucket_s = bucket_s
        self._start = session.start_time
        self._clock = clock
        self._emit_event = emit_event
        self._noise = noise if noise is not None else _NO_NOISE
        self._throughput: ThroughputReading | None = None  # the latest metrics' (tokens, MFU)
        self._on_stopped = on_stopped
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
        self._last: dict[str, float] = {}  # each scalar's latest value
        self._closed = False

    @property
    def failed(self) -> str | None:
        return self.writer.failed

    def start(self) -> None:
        self.writer.start()

    # -- the telemetry tap (agent thread) -----------------------------------------------------

    def on_steps(self, run: StepRun) -> None:
        """A poll's resolved steps, in order, as columns: a pass over a column per total
        rather than Python code per step (the agent thread's time per step is time the
        training thread waits for the GIL)."""
        try:
            sizes = run.sizes
            if sizes.count(sizes[0]) == len(sizes):  # the usual poll: one batch size
                self._add_run(sizes[0], run)
                return
            start = 0
            for size, same in groupby(sizes):
                stop = start + sum(1 for _ in same)
                self._add_run(size, run.part(start, stop))
                start = stop
        except Exception as exc:  # never into the agent's tick
            self._internal_error(exc)

    def _add_run(self, batch_size: int | None, run: StepRun) -> None:
        """Consecutive steps of one batch size."""
        bucket = self._bucket
        if bucket.batch_size != batch_size:
            if bucket.steps:  # a span has one batch size: a change closes it
                self._close_bucket(self._clock())
                bucket = self._bucket
            bucket.batch_size = batch_size
        bucket.steps += len(run.steps)
        self.step = run.steps[-1]
        durations, samples, phases = run.durations, run.samples, run.phases
        if batch_size is None and (counted := [n for n in samples if n]):
            _widen(bucket, min(counted), max(counted))
        try:  # a None (unknown) among them makes sum raise: counted as 0
            self.samples += sum(samples)  # type: ignore[arg-type]
        except TypeError:
            self.samples += sum(filter(None, samples))
        if any(run.eval_s):
            bucket.eval_s += math.fsum(run.eval_s)
        try:  # a None among them makes min raise: cheaper than looking for it
            total = math.fsum(durations) if min(durations) > 0 else None  # type: ignore[type-var]
        except TypeError:
            total = None
        if total is None or not math.isfinite(total):  # not every step timed: keep those that are
            timed = [i for i, d in enumerate(durations) if d is not None and 0 < d < math.inf]
            if not timed:
                return
            durations = [durations[i] for i in timed]
            samples = [samples[i] for i in timed]
            phases = None if phases is None else [phases[i] for i in timed]
            total = math.fsum(durations)  # type: ignore[arg-type]
        bucket.timed_steps += len(durations)
        bucket.timed_s += total
        bucket.step_time.extend(durations, total)  # type: ignore[arg-type]
        try:
            bucket.timed_samples += sum(samples)  # type: ignore[arg-type]
        except TypeError:  # a None: steps whose samples are unknown
            bucket.timed_samples += sum(filter(None, samples))
            bucket.uncounted_s += math.fsum(
                compress(durations, map(is_, samples, repeat(None)))  # type: ignore[arg-type]
            )
        if phases is not None:
            for index in sampled_indices(phases):
                bucket.phases.add(durations[index], phases[index])  # type: ignore[arg-type]
        count_step_bins(durations, bucket.hist)  # type: ignore[arg-type]

    def on_step(self, done: StepDone) -> None:
        self.on_steps(StepRun.of(done))

    def on_scalars(self, name: str, values: list[float]) -> None:
        try:
            bucket = self._bucket
            acc = bucket.scalars.get(name)
            if acc is None:
                acc = bucket.scalars[name] = StatAcc()
            acc.extend(values)
            if name not in self._last:
                bucket.first[name] = values[0]  # the first value of the run, not a span's mean
            self._last[name] = values[-1]
        except Exception as exc:
            self._internal_error(exc)

    def on_scalar(self, name: str, value: float) -> None:
        self.on_scalars(name, [value])

    def _internal_error(self, exc: Exception) -> None:
        self.telemetry.tap = None
        self.writer.fail(f"internal error in the recorder ({type(exc).__name__}: {exc})")

    # -- each tick (agent thread) -------------------------------------------------------------

    def on_metrics(self, metrics: Metrics) -> None:
        self._throughput = metrics.throughput

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
        noise = self._noise.reading
        span = Span(
            t0=bucket.t0,
            t1=max(now, bucket.t0),
            step=self.step,
            steps=bucket.steps,
            samples=self.samples,
            batch_size=bucket.batch_size,
            batch_range=list(bucket.examples_range) if bucket.examples_range else None,
            timed_steps=bucket.timed_steps,
            timed_s=bucket.timed_s,
            timed_samples=bucket.timed_samples,
            uncounted_s=bucket.uncounted_s,
            eval_s=bucket.eval_s,
            step_time=bucket.step_time.stat(),
            step_hist=bucket.hist,
            throughput=single(throughput(bucket.timed_samples, bucket.timed_s, bucket.uncounted_s)),
            scalars={name: acc.stat() for name, acc in bucket.scalars.items()},  # type: ignore[misc]
            first=bucket.first,
            b_simple=single(noise.b_simple),
            b_simple_at_least=noise.lower_bound if noise.b_simple is None else None,
            noise_steps=noise.samples or None,
            phases=bucket.phases if bucket.phases.steps else None,
            devices=devices,
            host=host,
            tokens=self._throughput.tokens if self._throughput else None,
            mfu=single(self._throughput.mfu) if self._throughput else None,
        )
        self.writer.put(encode_line(span), span_end=span.t1)
        self._bucket = _Bucket(now, bucket.batch_size)

    # -- any thread ---------------------------------------------------------------------------

    def probe(self, result: dict[str, Any], step: int) -> None:
        """Record a probe result (any thread; never raises)."""
        try:
            line = encode_line(ProbeLine(t=self._clock(), step=step, result=dict(result)))
        except Exception as exc:
            self._report_failure(f"a probe result could not be recorded: {exc}", stopped=False)
            return
        self.writer.put(line)

    def close(self, reason: str, step: int, timeout: float = CLOSE_TIMEOUT_S) -> bool:
        """Write the ``end`` line and close the file; True when the record ends with it (then
        its summary can be written): all was written, or the recording had stopped and its end
        says so."""
        if self._closed:
            return False
        self._closed = True
        end = End(
            t=self._clock(),
            reason=reason,
            step=max(step, self.step),
            samples=self.samples,
            last=dict(self._last),
        )
        self.writer.put(encode_line(end))
        if self.writer.finish(timeout):
            return True
        if self.writer.failed is None or not self.writer.done.is_set():
            return False  # still writing after the timeout: the file is not ours to touch
        stopped = msgspec.structs.replace(end, recording_stopped=self.writer.failed)
        return self.writer.append_last_word(encode_line(stopped))

    def _report_failure(self, message: str, stopped: bool = True) -> None:
        if stopped:
            self._on_stopped(message)
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
