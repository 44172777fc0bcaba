"""``bsmon replay``: a recorded session played back through the dashboard, read-only.

``load_replay`` reads the whole record (a torn last line is fine: the record of a killed job
replays up to its last whole line). ``RecordSource`` is a ``Source`` whose clock is the
playhead: it feeds the session model what the job had sent up to that moment, and moves the
playhead on (``speed`` seconds of the run per second) until paused or at the end.
``ReplayScreen`` is the dashboard plus the keys that pause and seek.
"""

from __future__ import annotations

import bisect
import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
from textual.binding import Binding

from bsmon.probes.record import End, Header, Span, Status, conversions, open_record
from bsmon.probes.wire import batch_varies
from bsmon.probes.wire.protocol import (
    CLIENT_COMMANDS,
    PROTOCOL_VERSION,
    Advice,
    AutopilotReading,
    Bye,
    Capability,
    Event,
    Hello,
    History,
    HostReading,
    Metrics,
    NoiseScaleReading,
)

from .screens import DashboardScreen
from .session import ReplayState, SessionModel, Snapshot
from .sources import Emit, Source

FRAME_S = 0.1
AUTO_PLAY_S = 30.0  # by default the whole run plays in about this long
SEEK_FRACTION = 0.05
MAX_SPEED = 1e7
READONLY = Capability(False, "a replay is read-only")


@dataclass
class ReplayData:
    path: Path
    header: Header
    spans: list[Span] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    statuses: list[Status] = field(default_factory=list)
    end: End | None = None
    torn: bool = False
    damaged: str | None = None  # the damaged lines left out, in a line (None: none)
    start: float = field(init=False)  # the session's start (Unix seconds)
    stop: float = field(init=False)  # the last recorded moment

    def __post_init__(self) -> None:
        self.start = self.stop = self.header.session.start_time

    @property
    def duration(self) -> float:
        return self.stop - self.start


def load_replay(path: Path | str) -> ReplayData:
    """Read a record for replay; raises ``RecordError`` with a one-line reason."""
    with open_record(path) as reader:
        data = ReplayData(reader.path, reader.header)
        for item in reader.lines():
            if isinstance(item, Span):
                data.spans.append(item)
            elif isinstance(item, Event):
                data.events.append(item)
            elif isinstance(item, Status):
                data.statuses.append(item)
            elif isinstance(item, End):
                data.end = item
        data.torn = reader.torn
        data.damaged = reader.damage_note()
    data.spans.sort(key=lambda s: s.t1)
    data.events.sort(key=lambda e: e.t)
    data.statuses.sort(key=lambda s: s.t)
    moments = [s.t1 for s in data.spans[-1:]] + [e.t for e in data.events[-1:]]
    data.stop = max([data.start, *moments, *([data.end.t] if data.end else [])])
    return data


def _last_index(spans: list[Span], has: Callable[[Span], object]) -> list[int]:
    """For each span, the index of the latest span up to it for which ``has`` holds (or -1)."""
    out, last = [], -1
    for i, span in enumerate(spans):
        if has(span):
            last = i
        out.append(last)
    return out


class RecordSource(Source):
    """Plays a record back; the UI thread steers it with ``toggle``, ``seek``, ``seek_to``
    and ``change_speed``."""

    readonly_reason = "a replay of a recorded session is read-only"

    def __init__(
        self,
        data: ReplayData,
        *,
        speed: float | None = None,
        position: float = 0.0,
        playing: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.data = data
        self.position = data.start + position * data.duration
        super().__init__(data.header.session.name, clock=lambda: self.position)
        self.speed = speed or max(1.0, data.duration / AUTO_PLAY_S)
        self.playing = playing and self.position < data.stop
        self._wall = clock
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._dirty = True
        self._t1s = [s.t1 for s in data.spans]
        self._event_ts = [e.t for e in data.events]
        self._status_ts = [s.t for s in data.statuses]
        self._timed = _last_index(data.spans, lambda s: s.timed_steps)
        self._devices = _last_index(data.spans, lambda s: s.devices)
        self._host = _last_index(data.spans, lambda s: s.host)
        self._reset()

    # -- controls (UI thread) -----------------------------------------------------------------

    def toggle(self) -> None:
        with self._lock:
            if not self.playing and self.position >= self.data.stop:
                self.position = self.data.start  # at the end, play starts over
            self.playing = not self.playing
            self._changed()

    def seek(self, steps: float) -> None:
        """Move by ``steps`` twentieths of the run (at least a second each)."""
        delta = steps * max(1.0, SEEK_FRACTION * self.data.duration)
        with self._lock:
            self._move_to(self.position + delta)

    def seek_to(self, fraction: float) -> None:
        with self._lock:
            self._move_to(self.data.start + fraction * self.data.duration)

    def change_speed(self, factor: float) -> None:
        with self._lock:
            self.speed = min(MAX_SPEED, max(0.25, self.speed * factor))
            self._changed()

    def _move_to(self, position: float) -> None:
        self.position = min(self.data.stop, max(self.data.start, position))
        if self.position >= self.data.stop:
            self.playing = False
        self._changed()

    def _changed(self) -> None:
        self._dirty = True
        self._wake.set()

    def stop(self) -> None:
        super().stop()
        self._wake.set()

    # -- the worker thread --------------------------------------------------------------------

    def run(self, emit: Emit) -> None:
        last = self._wall()
        while not self.stopped:
            now = self._wall()
            with self._lock:
                changed, self._dirty = self._dirty, False
                if self.playing:
                    self.position = min(self.data.stop, self.position + (now - last) * self.speed)
                    self.playing = self.position < self.data.stop
                    changed = True
                position = self.position
            last = now
            if changed:
                self._show(position)
                self._emit_update(emit)
            self._wake.wait(FRAME_S)
            self._wake.clear()

    def _reset(self) -> None:
        self.model = SessionModel(self.target, clock=lambda: self.position)
        self._fed = self.data.start
        self._span_i = self._event_i = self._status_i = 0
        self._status: Status | None = None
        self._bye = False
        self._autopilot: AutopilotReading | None = None
        self._advice: Advice | None = None
        self.model.feed(self._hello())

    def _hello(self) -> Hello:
        data, status = self.data, self._status
        unknown = Capability(False, "not recorded yet at this point of the run")
        return Hello(
            protocol=PROTOCOL_VERSION,
            session=msgspec.structs.replace(data.header.session, record=str(data.path)),
            step=0,
            batch_size=data.header.batch_size,
            capabilities={kind: READONLY for kind in CLIENT_COMMANDS},
            gpu=status.gpu if status else unknown,
            noise_scale=status.noise_scale if status else unknown,
        )

    def _show(self, position: float) -> None:
        """Bring the model to ``position``: forward by feeding, backward by starting over."""
        data, model = self.data, self.model
        if position < self._fed:
            self._reset()
            model = self.model
        statuses = bisect.bisect_right(self._status_ts, position)
        if statuses > self._status_i:
            self._status, self._status_i = data.statuses[statuses - 1], statuses
            model.feed(self._hello())  # the same pid: keeps what was fed
        spans = bisect.bisect_right(self._t1s, position)
        new = [conversions.point_of(s) for s in data.spans[self._span_i : spans] if s.steps]
        if new:
            model.feed(History(points=new))
        self._span_i = spans
        events = bisect.bisect_right(self._event_ts, position)
        for event in data.events[self._event_i : events]:
            model.feed(event)
            self._autopilot = conversions.autopilot_after(self._autopilot, event)
            self._advice = conversions.advice_after(self._advice, event)
        self._event_i = events
        if spans:
            model.feed(self._metrics(spans - 1, position))
        if data.end is not None and position >= data.stop and not self._bye:
            model.feed(Bye(reason=data.end.reason, t=data.end.t))
            self._bye = True
        self._fed = position

    def _metrics(self, index: int, position: float) -> Metrics:
        spans = self.data.spans
        span = spans[index]
        timed = spans[self._timed[index]] if self._timed[index] >= 0 else None
        point = conversions.point_of(timed) if timed else None
        devices = spans[self._devices[index]].devices if self._devices[index] >= 0 else []
        host = spans[self._host[index]].host if self._host[index] >= 0 else None
        status = self._status
        session = self.data.header.session
        if position >= self.data.stop:  # at the end: the whole run's split, not the last span's
            anatomy = conversions.run_anatomy(spans, session)
        else:
            anatomy = conversions.recorded_anatomy(timed, session) if timed else None
        return Metrics(
            t=position,
            step=span.step,
            batch_size=span.batch_size,
            batch_varies=batch_varies(span.batch_range),
            step_time_s=point.step_time_s if point else None,
            samples_per_s=point.samples_per_s if point else None,
            b_simple=span.b_simple.mean if span.b_simple else None,
            noise=conversions.recorded_noise(span) or NoiseScaleReading(),
            anatomy=anatomy,
            samples=span.samples,
            devices=[conversions.device_reading(d) for d in devices],
            gpu=status.gpu if status else Capability(False, "not recorded"),
            host=HostReading(
                cpu_percent=host.cpu.mean if host and host.cpu else None,
                rss_bytes=int(host.rss.max) if host and host.rss else None,
            ),
            autopilot=self._autopilot,
            advice=self._advice,
        )

    def snapshot(self) -> Snapshot:
        data = self.data
        ended = None
        if self.position >= data.stop:
            ended = (
                f"the job finished ({data.end.reason})"
                if data.end
                else "the record stops here with no end: the job was killed, or is still running"
            )
        return dataclasses.replace(
            self.model.snapshot(),
            silent_s=None,  # a record's spans come seconds apart: silence is a live notion
            replay=ReplayState(
                path=str(data.path),
                position_s=self.position - data.start,
                duration_s=data.duration,
                playing=self.playing,
                speed=self.speed,
                ended=ended,
            ),
        )


class ReplayScreen(DashboardScreen):
    """The dashboard on a ``RecordSource``, with keys to pause and seek."""

    BINDINGS = [  # priority: the event log's scrolling keys must not swallow them
        Binding("space", "toggle", "Play/Pause", id="replay_toggle", priority=True),
        Binding("left", "seek(-1)", "Back", id="replay_back", priority=True),
        Binding("right", "seek(1)", "Fwd", id="replay_forward", priority=True),
        Binding("home", "seek_to(0)", "Start", id="replay_start", show=False, priority=True),
        Binding("end", "seek_to(1)", "End", id="replay_end", show=False, priority=True),
        Binding(
            "greater_than_sign,full_stop", "speed(2)", "Faster", id="replay_faster", show=False
        ),
        Binding("less_than_sign,comma", "speed(0.5)", "Slower", id="replay_slower", show=False),
    ]

    source: RecordSource

    def action_toggle(self) -> None:
        self.source.toggle()

    def action_seek(self, steps: float) -> None:
        self.source.seek(steps)

    def action_seek_to(self, fraction: float) -> None:
        self.source.seek_to(fraction)

    def action_speed(self, factor: float) -> None:
        self.source.change_speed(factor)
