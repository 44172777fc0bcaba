"""What the dashboard knows about one job, built from protocol messages.

``SessionModel`` is fed messages in order (by the socket reader thread, or by a scripted
source in tests) and hands out immutable ``Snapshot``s; the UI renders only snapshots, so
it never shares mutable state with the reader thread.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from bsmon.probes.record import DecimatingHistory, merge_points, metrics_history
from bsmon.probes.wire.protocol import (
    Bye,
    Capability,
    Event,
    Hello,
    History,
    Message,
    Metrics,
    MetricsPoint,
    Notice,
    Reply,
    SessionInfo,
)

EVENT_LIMIT = 500
POINT_INTERVAL_S = 1.0
# A live job sends a message at least every second (docs/protocol.md); this long without one,
# the whole process is stopped, hung, or holds Python's lock in a long call.
SILENT_AFTER_S = 4.0


class ConnState(enum.Enum):
    CONNECTING = "connecting"
    LIVE = "live"
    FINISHED = "finished"
    DISCONNECTED = "disconnected"


@dataclass(frozen=True)
class ReplayState:
    """Where a replay is in the recorded run (``Snapshot.replay``; None when live)."""

    path: str
    position_s: float  # seconds into the run
    duration_s: float
    playing: bool
    speed: float
    ended: str | None = None  # at the end of the record: how the run ended


@dataclass(frozen=True)
class Snapshot:
    """Everything one frame of the dashboard shows."""

    state: ConnState
    detail: str
    target: str
    session: SessionInfo | None = None
    capabilities: dict[str, Capability] = field(default_factory=dict)
    noise_capability: Capability | None = None
    latest: Metrics | None = None
    points: tuple[MetricsPoint, ...] = ()
    events: tuple[Event, ...] = ()
    now: float = 0.0
    replay: ReplayState | None = None
    silent_s: float | None = None  # live, but nothing heard for this long (>= SILENT_AFTER_S)

    @property
    def uptime_s(self) -> float | None:
        if self.session is None:
            return None
        return max(0.0, self.now - self.session.start_time)

    def can(self, command: str) -> bool:
        """Whether the job, as connected now, accepts ``command``."""
        cap = self.capabilities.get(command)
        return self.state is ConnState.LIVE and bool(cap and cap.available)


class SessionModel:
    def __init__(self, target: str, clock: Callable[[], float] = time.time) -> None:
        self.target = target
        self._clock = clock
        self.state = ConnState.CONNECTING
        self.detail = f"connecting to {target}"
        self.hello: Hello | None = None
        self.latest: Metrics | None = None
        self.points: DecimatingHistory[MetricsPoint] = metrics_history()
        self.events: deque[Event] = deque(maxlen=EVENT_LIMIT)
        self.replies: list[Reply] = []
        self.notices: list[Notice] = []
        self._last_seen = 0.0
        self._last_heard: float | None = None  # the clock when the last message came
        self._pending: MetricsPoint | None = None
        self._pending_since = 0.0

    def feed(self, message: Message) -> None:
        self._last_heard = self._clock()
        if isinstance(message, Hello):
            self._on_hello(message)
        elif isinstance(message, History):
            for point in message.points:
                self.points.append(point)
        elif isinstance(message, Metrics):
            self._on_metrics(message)
        elif isinstance(message, Event):
            self.events.append(message)
        elif isinstance(message, Reply):
            self.replies.append(message)
        elif isinstance(message, Notice):
            self.notices.append(message)
            if message.closing:
                self.detail = message.message
        elif isinstance(message, Bye):
            self.state = ConnState.FINISHED
            self.detail = f"the job finished ({message.reason})"
            self._last_seen = message.t

    def _on_hello(self, hello: Hello) -> None:
        same_job = self.hello is not None and self.hello.session.pid == hello.session.pid
        if not same_job:  # a new process: its history replaces the old one
            self.points = metrics_history()
            self._pending = None
            self.events.clear()
            self.latest = None
        self.hello = hello
        self.state = ConnState.LIVE
        self.detail = f"attached to {hello.session.name} (pid {hello.session.pid})"

    def _on_metrics(self, metrics: Metrics) -> None:
        """Live metrics come at up to 4 Hz; they are pooled into points of about a second,
        the resolution of the backlog, so the chart looks the same before and after attach."""
        self.latest = metrics
        self._last_seen = metrics.t
        if not metrics.steps_in_window:
            return
        point = MetricsPoint(
            t=metrics.t,
            step=metrics.step,
            steps=metrics.steps_in_window,
            batch_size=metrics.batch_size,
            step_time_s=metrics.step_time_s,
            samples_per_s=metrics.samples_per_s,
            samples=metrics.samples,
            scalars=metrics.scalars,
            noise=metrics.noise if metrics.noise.b_simple is not None else None,
            anatomy=metrics.anatomy,  # the last steps' split: the `t` view's run chart
        )
        if self._pending is None:
            self._pending, self._pending_since = point, metrics.t
        else:
            self._pending = merge_points(self._pending, point)
        if metrics.t - self._pending_since >= POINT_INTERVAL_S:
            self.points.append(self._pending)
            self._pending = None

    def disconnected(self, reason: str) -> None:
        if self.state is not ConnState.FINISHED:
            self.state = ConnState.DISCONNECTED
            self.detail = reason

    def connecting(self, detail: str) -> None:
        if self.state is ConnState.CONNECTING:
            self.detail = detail

    def silent_s(self) -> float | None:
        """How long a live job has sent nothing, once that is SILENT_AFTER_S or more."""
        if self.state is not ConnState.LIVE or self._last_heard is None:
            return None
        quiet = self._clock() - self._last_heard
        return quiet if quiet >= SILENT_AFTER_S else None

    def snapshot(self) -> Snapshot:
        hello = self.hello
        live = self.state is ConnState.LIVE
        return Snapshot(
            state=self.state,
            detail=self.detail,
            target=self.target,
            session=hello.session if hello else None,
            capabilities=dict(hello.capabilities) if hello else {},
            noise_capability=hello.noise_scale if hello else None,
            latest=self.latest,
            points=self.points.snapshot() + ((self._pending,) if self._pending else ()),
            events=tuple(self.events),
            now=self._clock() if live or not self._last_seen else self._last_seen,
            silent_s=self.silent_s(),
        )
