"""The agent thread: drains the training thread's inbox, aggregates, serves the socket.

One daemon thread runs an asyncio loop with the socket server and a 4 Hz tick; a second
daemon thread samples devices once a second (NVML and psutil calls can take milliseconds and
must not delay the tick). Neither ever takes a lock the training thread holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import msgspec

from ..wire import discovery, protocol
from ..wire.protocol import Capability, Hello, HostReading, SessionInfo
from ..wire.routing import CommandRouter
from ..wire.server import AgentServer, asyncio_logs_kept_from_the_job
from .devices import DeviceSample, DeviceSampler
from .hot_path import NEVER
from .inbox import TICK_S, Inbox
from .steps import StepRun
from .telemetry import Telemetry

SOCKET_CHECK_S = 1.0
HISTORY_CHUNK = 512


class PeriodicSampler(threading.Thread):
    """Samples devices every ``interval_s`` (or sooner when asked) and keeps the latest
    reading."""

    def __init__(self, sampler: DeviceSampler, interval_s: float) -> None:
        super().__init__(name="bsmon-sampler", daemon=True)
        self._sampler = sampler
        self._interval = interval_s
        self._stop_event = threading.Event()
        self._due = threading.Event()  # a sample asked for before the interval ends
        self.latest = DeviceSample(
            devices=[], gpu=Capability(False, "not sampled yet"), host=HostReading()
        )

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                self.latest = self._sampler.sample()
            except Exception as exc:  # a sampler bug must not end the thread
                self.latest = DeviceSample(
                    devices=[],
                    gpu=Capability(False, f"sampler: {exc}"),
                    host=HostReading(error=str(exc)),
                )
            self._due.wait(self._interval)
            self._due.clear()
        self._sampler.close()

    def sample_soon(self) -> None:
        """Take the next sample now rather than at the end of the interval (any thread)."""
        self._due.set()

    def stop(self) -> None:
        self._stop_event.set()
        self._due.set()


@dataclass(frozen=True, slots=True)
class TickDone:
    """What one tick of the agent thread saw, once its messages are out."""

    t: float
    events: list[protocol.Event]  # new since the previous tick
    sample: DeviceSample
    noise_scale: Capability
    final: bool  # the last tick: the session is closing


class MetricsPart(TypedDict, total=False):
    """The fields an extension fills in a metrics message (each field has one owner)."""

    b_simple: float | None
    noise: protocol.NoiseScaleReading
    anatomy: protocol.StepAnatomy | None
    autopilot: protocol.AutopilotReading
    batch: protocol.BatchReading
    probe: protocol.ProbeReading
    ranks: protocol.RanksReading | None


class HelloPart(TypedDict, total=False):
    """The fields an extension fills in a hello."""

    autopilot: protocol.AutopilotReading
    batch: protocol.BatchReading


class Extension:
    """A part of the agent that works on the agent thread beside the telemetry: it sees each
    inbox record telemetry does not take, each device sample, each metrics message and hello
    (to which it returns its part), and each tick's end. One that needs the training thread at
    some steps says so with ``at_boundary`` (the agent's scheduled slow path calls it); one
    that put something into the job takes it out in ``detach`` as the monitor closes, and one
    with something to say at the end says it in ``last_word``."""

    def at_boundary(self, step: int, now: float) -> int:
        """Training thread, at a scheduled step boundary (the end of ``step``, at ``now``): do
        what is due and get the next step ready; the next step whose end needs it (``NEVER``:
        none). Called only for the extensions that define it (``takes_boundaries``), never on
        an ordinary step."""
        return NEVER

    def on_record(self, record: object) -> None:
        """Called for each inbox record that telemetry does not take (in order)."""

    def on_steps(self, run: StepRun) -> None:
        """A poll's resolved steps, in order, as columns (durations, samples, sizes, the
        sampled steps' phases). Called only for the extensions that define it
        (``takes_steps``): no one reading them, the steps are never laid out as runs."""

    def on_tick(self, sample: DeviceSample) -> None:
        """Called every tick with the latest device sample."""

    def metrics_part(self, metrics: protocol.Metrics) -> MetricsPart:
        """This extension's fields of a metrics message, read from the message as telemetry,
        the device sample and the extensions before it made it (the noise scale's reading is
        first in)."""
        return {}

    def on_metrics(self, metrics: protocol.Metrics) -> None:
        """Sees each finished metrics message, every part in (read only), before it is sent."""

    def hello_part(self, hello: Hello) -> HelloPart:
        """This extension's fields of a hello."""
        return {}

    def after_tick(self, done: TickDone) -> None:
        """Called at the end of every tick, after its events and metrics were sent."""

    def next_tick_s(self) -> float | None:
        """How soon this extension needs the next tick, if sooner than ``TICK_S``."""
        return None

    def detach(self) -> None:
        """The monitor is closing (on its closing thread, a forked child's too, before the
        agent's last tick): take out what this part put into the job (hooks on the model and
        optimizer, threads, a sidecar). ``attach()`` put it in; nothing is said here."""

    def last_word(self) -> None:
        """The session is ending (on the closing thread of the process that attached, after
        every part detached, before the agent's last tick, which sends what is said here):
        say what is left to say, as events."""


def takes_boundaries(part: Extension) -> bool:
    """Whether ``part`` has work at scheduled step boundaries (it defines ``at_boundary``)."""
    return type(part).at_boundary is not Extension.at_boundary


def takes_steps(part: Extension) -> bool:
    """Whether ``part`` reads the resolved steps (it defines ``on_steps``)."""
    return type(part).on_steps is not Extension.on_steps


class AgentService(threading.Thread):
    def __init__(
        self,
        *,
        inbox: Inbox,
        telemetry: Telemetry,
        router: CommandRouter,
        sampler: PeriodicSampler,
        session: SessionInfo,
        socket_path: Path | None,
        fault_count: Callable[[], int],
        noise_capability: Callable[[], Capability],
        extensions: Sequence[Extension] = (),
        on_rebound: Callable[[], None] = lambda: None,
        report: Callable[[str, BaseException], None] = lambda _where, _exc: None,
    ) -> None:
        """``report``: where a failure of the agent's own code goes (the fault guard)."""
        super().__init__(name="bsmon-agent", daemon=True)
        self._inbox = inbox
        self.tick_period = TICK_S  # seconds to the next tick unless woken
        self.telemetry = telemetry
        self.router = router
        self.sampler = sampler
        self.session = session
        self._fault_count = fault_count
        self._noise_capability = noise_capability
        self.extensions = list(extensions)
        # the telemetry's tap (the recorder) reads the steps as the tap, which it lets go of
        # when it fails or ends, not as one of these
        telemetry.read_steps_by(
            part.on_steps
            for part in self.extensions
            if takes_steps(part) and part is not telemetry.tap
        )
        self._on_rebound = on_rebound
        self._report = report
        self.server = (
            AgentServer(socket_path, router.handle_line, self._greeting)
            if socket_path is not None
            else None
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._woken: asyncio.Event | None = None  # set: tick now, not at the period's end
        self._bye_reason = "closed"
        self.ready = threading.Event()
        self.startup_error: BaseException | None = None

    # -- lifecycle (any thread) ---------------------------------------------------------------

    def start_and_wait(self, timeout: float = 10.0) -> None:
        self.sampler.start()
        self.start()
        if not self.ready.wait(timeout):
            raise TimeoutError("bsmon agent thread did not start in time")
        if self.startup_error is not None:
            raise self.startup_error

    def stop(self, reason: str = "closed", timeout: float = 5.0) -> None:
        self._bye_reason = reason
        self._call_soon(self._stop_now)
        self.sampler.stop()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)

    def detach_extensions(self) -> None:
        """Every extension takes out what it put into the job, in the list's order (the
        closing thread: ``Extension.detach``)."""
        for extension in self.extensions:
            extension.detach()

    def last_words(self) -> None:
        """Every extension says what is left to say as the session ends, in the list's order
        (the closing thread: ``Extension.last_word``)."""
        for extension in self.extensions:
            extension.last_word()

    def wake(self) -> None:
        """Tick now rather than at the end of the period (``Monitor.flush``)."""
        self._call_soon(self._wake_now)

    def _call_soon(self, callback: Callable[[], None]) -> None:
        loop = self._loop
        if loop is not None and self._woken is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed in between
                loop.call_soon_threadsafe(callback)

    # -- the thread ---------------------------------------------------------------------------

    def _wake_now(self) -> None:
        assert self._woken is not None
        self._woken.set()

    def _stop_now(self) -> None:
        assert self._stopping is not None
        self._stopping.set()
        self._wake_now()

    def run(self) -> None:
        loop = asyncio.new_event_loop()
        loop.set_exception_handler(self._loop_exception)
        self._loop = loop
        try:
            with asyncio_logs_kept_from_the_job():
                loop.run_until_complete(self._main())
        except BaseException as exc:
            self.startup_error = self.startup_error or exc
        finally:
            self.ready.set()
            loop.close()

    def _loop_exception(self, _loop: asyncio.AbstractEventLoop, context: dict) -> None:
        """What asyncio would log (a task's unretrieved exception, a failed callback) is
        reported as bsmon's own error instead of printed into the job's stderr."""
        exc = context.get("exception")
        self._report("the agent's event loop", exc or RuntimeError(context.get("message")))

    async def _main(self) -> None:
        self._stopping = asyncio.Event()
        self._woken = asyncio.Event()
        try:
            if self.server is not None:
                await self.server.start()
        except BaseException as exc:
            self.startup_error = exc
            self.ready.set()
            return
        self.ready.set()
        next_check = time.monotonic() + SOCKET_CHECK_S
        while not self._stopping.is_set():
            self._guarded_tick()
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + SOCKET_CHECK_S
                await self._rebind_if_deleted()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._woken.wait(), self.tick_period)
            self._woken.clear()
        self._guarded_tick(final=True)
        if self.server is not None:
            bye = protocol.encode(protocol.Bye(reason=self._bye_reason, t=time.time()))
            await self.server.stop(farewell=bye)

    async def _rebind_if_deleted(self) -> None:
        """A socket file deleted under the job (a tmp cleaner, a stray ``rm``) is made again,
        so a monitor can still attach; connected monitors never notice."""
        if self.server is None or not self.server.socket_missing():
            return
        try:
            discovery.ensure_private_dir(self.server.path.parent)  # it may have gone too
            await self.server.start()
        except (OSError, discovery.BsmonDirError):
            return  # tried again at the next check
        self._on_rebound()

    def _guarded_tick(self, final: bool = False) -> None:
        """A tick whose failure is reported (an event, counted) and leaves the agent ticking,
        serving and closing as before: a bug in one part of bsmon must not end the rest."""
        try:
            self.tick(final)
        except Exception as exc:
            self._report("the agent's tick", exc)

    def tick(self, final: bool = False) -> None:
        """Drain the inbox, aggregate, and broadcast what is new (agent thread only)."""
        telemetry = self.telemetry
        flushes: list[threading.Event] = []
        self.tick_period = TICK_S  # unless the tick ends with an extension asking for sooner
        try:
            self._tick(telemetry, flushes, final)
        finally:  # a flush waits for what was drained, however the tick ended
            for done in flushes:
                done.set()

    def _tick(self, telemetry: Telemetry, flushes: list[threading.Event], final: bool) -> None:
        telemetry.drain(self._inbox, self._to_extensions)
        telemetry.poll()
        sample = self.sampler.latest
        for extension in self.extensions:
            extension.on_tick(sample)
        now = time.time()
        flushes += telemetry.flushes
        telemetry.flushes = []
        metrics = telemetry.take_metrics(now, force=final or bool(flushes))
        if metrics is not None:
            metrics.t = now
            metrics.devices = sample.devices
            metrics.gpu = sample.gpu
            metrics.host = sample.host
            metrics.errors = self._fault_count()
            for extension in self.extensions:
                if part := extension.metrics_part(metrics):
                    metrics = msgspec.structs.replace(metrics, **part)
            telemetry.keep_history(now, metrics)
            for extension in self.extensions:
                extension.on_metrics(metrics)
        events = telemetry.take_new_events()
        if self.server is not None:  # events first: a change is announced before its metrics
            for event in events:
                self.server.broadcast(protocol.encode(event), droppable=False)
            if metrics is not None:
                self.server.broadcast_metrics(metrics)
        done_tick = TickDone(now, events, sample, self._noise_capability(), final)
        for extension in self.extensions:
            extension.after_tick(done_tick)
        wanted = (extension.next_tick_s() for extension in self.extensions)
        self.tick_period = min((TICK_S, *(period for period in wanted if period is not None)))

    def _to_extensions(self, record: object) -> None:
        for extension in self.extensions:
            extension.on_record(record)

    def _greeting(self) -> list[bytes]:
        telemetry = self.telemetry
        sample = self.sampler.latest
        hello = Hello(
            protocol=protocol.PROTOCOL_VERSION,
            session=self.session,
            step=telemetry.step,
            batch_size=telemetry.batch_size,
            capabilities=self.router.capabilities(),
            gpu=sample.gpu,
            noise_scale=self._noise_capability(),
            devices=sample.devices,
        )
        parts: HelloPart = {}
        for extension in self.extensions:
            parts.update(extension.hello_part(hello))
        hello = msgspec.structs.replace(hello, **parts)
        lines = [protocol.encode(hello)]
        points = telemetry.history.snapshot()
        starts = range(0, max(len(points), 1), HISTORY_CHUNK)
        for start in starts:
            chunk = list(points[start : start + HISTORY_CHUNK])
            final = start == starts[-1]
            lines.append(protocol.encode(protocol.History(points=chunk, final=final)))
        lines.extend(protocol.encode(event) for event in telemetry.events)
        return lines
