"""Aggregation on the agent thread: step records in, metrics windows and history points out.

The training thread only appends small records to an inbox (``inbox``); everything here runs
later, on the agent thread, so its cost never lands on a training step.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..anatomy.marks import StepMarks
from ..anatomy.phases import Phases, phases_of, with_comm
from ..anatomy.window import PhaseWindow, anatomy_of
from ..record.format import StepDone
from ..record.history import DecimatingHistory, metrics_history
from ..wire.protocol import Event, Metrics, MetricsPoint, NoiseScaleReading
from .hot_path import LOGGED, LOSS, LOSS_GIVEN, STEP
from .inbox import Flush
from .samples import StepTally
from .timing import (
    Captured,
    CudaMark,
    ScalarError,
    capture_run,
    capture_scalar,
    elapsed,
    read_values,
)

HISTORY_INTERVAL_S = 1.0
HEARTBEAT_INTERVAL_S = 1.0
EVENT_BACKLOG = 500


def training_time(duration: float | None, eval_s: float) -> float | None:
    """A step's duration without the evaluation inside it (None: not timed; also when the
    evaluation, timed on the host, takes all of a duration timed on a device)."""
    if duration is None or not eval_s:
        return duration
    rest = duration - eval_s
    return rest if rest > 0 else None


def _no_report(_where: str, _exc: BaseException) -> None:
    return None


class StepTap(Protocol):
    def on_steps(self, done: list[StepDone]) -> None: ...
    def on_scalars(self, name: str, values: list[float]) -> None: ...


@dataclass
class _Window:
    """Steps whose durations have been resolved since the window was last taken."""

    steps: int = 0
    timed_steps: int = 0
    duration_s: float = 0.0
    timed_samples: int = 0
    counted_s: float = 0.0  # the part of duration_s whose steps' samples were counted
    scalar_sums: dict[str, float] = field(default_factory=dict)
    scalar_counts: dict[str, int] = field(default_factory=dict)

    def add_steps(
        self, steps: int, timed: int, duration_s: float, samples: int, counted_s: float
    ) -> None:
        """``steps`` steps, ``timed`` of them timed (``duration_s`` in all), ``samples`` of
        theirs counted over ``counted_s`` of that time."""
        self.steps += steps
        self.timed_steps += timed
        self.duration_s += duration_s
        self.timed_samples += samples
        self.counted_s += counted_s

    def add_scalars(self, name: str, total: float, count: int) -> None:
        self.scalar_sums[name] = self.scalar_sums.get(name, 0.0) + total
        self.scalar_counts[name] = self.scalar_counts.get(name, 0) + count

    @property
    def step_time_s(self) -> float | None:
        return self.duration_s / self.timed_steps if self.timed_steps else None

    @property
    def samples_per_s(self) -> float | None:
        return self.timed_samples / self.counted_s if self.counted_s > 0 else None

    def scalars(self) -> dict[str, float]:
        return {k: self.scalar_sums[k] / self.scalar_counts[k] for k in self.scalar_sums}


class Telemetry:
    def __init__(self, history_capacity: int = 2048) -> None:
        self.step = 0
        self.samples: int | None = 0  # None once a step's samples could not be counted
        self.samples_note: str | None = None  # why they are not counted (set by the monitor)
        self.batch_size: int | None = None
        self.last_step_time = 0.0
        self.step_time_s: float | None = None
        self.samples_per_s: float | None = None
        self.scalars: dict[str, float] = {}
        self.noise = NoiseScaleReading()
        self.history: DecimatingHistory[MetricsPoint] = metrics_history(history_capacity)
        self.events: deque[Event] = deque(maxlen=EVENT_BACKLOG)
        self.tally = StepTally()
        # taken in, waiting for their phase marks: (step, end, samples, batch size, eval_s,
        # marks), ``end`` the post-hook's perf_counter (durations are the differences)
        self._steps: deque[tuple] = deque()
        self._previous_end: float | None = None  # the previous step's end (perf_counter)
        self.anatomy = PhaseWindow()
        self.comm_sample: Callable[[], float | None] = lambda: None  # DDP's latest wait
        self.eval_s = 0.0  # evaluation time inside the loop so far, kept out of step times
        self._logged: dict[str, list[object]] = {}  # this tick's mon.log values by name
        self._losses: list[object] = []  # this tick's tensors backward() was called on
        # where the values read go to be freed (the training thread: ``HotPath.hand_back``)
        self.hand_back: Callable[[list[Any]], None] = lambda _values: None
        self._pending_scalars: deque[tuple[str, Captured | list[float]]] = deque()
        self._window = _Window()
        self._second = _Window()
        self._second_started = time.time()
        self._last_emit = 0.0
        self._nonfinite_reported: set[str] = set()
        self.new_events: list[Event] = []
        self.flushes: list[threading.Event] = []  # to set once this tick's output is sent
        # Sees every resolved step and scalar (agent thread), a poll's worth at a time:
        # on_steps([StepDone...]) and on_scalars(name, values). The session recorder uses it.
        self.tap: StepTap | None = None
        self.duration_listeners: list[Callable[[list[StepDone]], None]] = []
        self._loss_given = False  # a LOSS_GIVEN came: the LOSS after it is left out
        self.report: Callable[[str, BaseException], None] = _no_report  # a bad mon.log value
        # why a step's samples are unknown (None: they are not; called once per session)
        self.samples_reason: Callable[[int], str | None] = lambda _step: None

    # -- ingest (agent thread) ----------------------------------------------------------------

    def drain(self, inbox: deque[Any], other: Callable[[object], None]) -> None:
        """Take every record in ``inbox`` in order; one that is not telemetry's goes to
        ``other`` (the extensions) in its turn. A step costs one call here (its samples): on
        the small steps of a host-bound job the agent thread's work per step is what the
        training thread waits for, since the two share the GIL."""
        self._take(inbox, other)
        while self._logged or self._losses:
            self._capture_scalars()
            self._take(inbox, other)  # the events of bad values among them, at once

    def _take(self, inbox: deque[Any], other: Callable[[object], None]) -> None:
        popleft = inbox.popleft
        steps_append = self._steps.append
        resolve = self.tally.resolve
        wall_offset = time.time() - time.perf_counter()
        logged = self._logged
        losses = self._losses
        while inbox:
            record = popleft()
            if type(record) is not tuple:
                if isinstance(record, Event):
                    self.add_event(record)
                elif isinstance(record, Flush):
                    self.flushes.append(record.done)
                else:
                    other(record)
                continue
            kind = record[0]
            if kind == STEP:
                _, step, end, taken, model_examples, declared, eval_s, marks = record
                samples, size = resolve(taken, model_examples, declared)
                self.step = step
                if samples is not None:
                    self.samples = (self.samples or 0) + samples
                else:
                    self._uncounted(step)
                self.batch_size = size
                self.last_step_time = end + wall_offset
                steps_append((step, end, samples, size, eval_s, marks))
                if eval_s:
                    self.eval_s += eval_s
            elif kind == LOGGED:
                for name, value in record[2].items():
                    values = logged.get(name)
                    if values is None:
                        logged[name] = [value]
                    else:
                        values.append(value)
            elif kind == LOSS:
                if self._loss_given:  # the backward() inside the framework's: not the loss
                    self._loss_given = False
                else:
                    losses.append(record[2])
            elif kind == LOSS_GIVEN:
                losses.append(record[2])
                self._loss_given = True
            else:
                other(record)

    def _uncounted(self, step: int) -> None:
        if not self.samples:
            self.samples = None  # nothing counted yet: unknown, not zero
        if self.samples_note is None:
            self.samples_note = self.samples_reason(step)

    def _capture_scalars(self) -> None:
        """The tick's values of each name, captured together (one device read per name)."""
        pending = self._pending_scalars
        logged, self._logged = self._logged, {}
        for name, values in logged.items():
            run = capture_run(values)
            if run is not None:
                pending.append((name, run))
                continue
            for value in values:
                try:
                    pending.append((name, capture_scalar(name, value)))
                except (ScalarError, RuntimeError) as exc:
                    self.report(f"log({name}=...)", exc)
        losses, self._losses = self._losses, []
        if losses:
            run = capture_run(losses)
            if run is not None:
                pending.append(("loss", run))
            else:
                for loss in losses:
                    self._capture_loss(loss)
        self.hand_back([logged, losses])

    def _capture_loss(self, loss: object) -> None:
        """The tensor ``backward()`` was called on (bsmon run): the loss when it is a scalar."""
        try:
            if loss.numel() == 1:  # type: ignore[attr-defined]
                self._pending_scalars.append(("loss", capture_scalar("loss", loss)))
        except (ScalarError, RuntimeError) as exc:
            self.report("reading the loss at backward()", exc)

    def add_event(self, event: Event) -> None:
        self.events.append(event)
        self.new_events.append(event)

    def take_new_events(self) -> list[Event]:
        events, self.new_events = self.new_events, []
        return events

    def poll(self) -> None:
        """Resolve whatever durations and scalars have become readable."""
        done = self._resolve_steps()
        if done:
            for listener in self.duration_listeners:
                listener(done)
            if self.tap is not None:
                self.tap.on_steps(done)
        self._read_scalars()

    def _resolve_steps(self) -> list[StepDone]:
        """The steps taken in whose durations are known now, in order, added to the windows.
        They are plain tuples laid out as ``StepDone`` (a named tuple costs a Python call
        each)."""
        steps = self._steps
        done: list[StepDone] = []
        append = done.append
        previous = self._previous_end
        timed = counted = 0
        duration_sum = counted_sum = 0.0
        while steps:
            step, end, samples, size, eval_s, marks = steps[0]
            phases = None
            if marks is not None:
                mark = marks.end
                if isinstance(mark, CudaMark) and not mark.event.query():
                    break  # the sampled step's device work is still running; keep the order
                phases = self._phases(marks, eval_s)
            steps.popleft()
            duration = None
            if previous is not None:
                duration = end - previous
                if eval_s:
                    duration = training_time(duration, eval_s)
                if duration is not None and duration > 0:
                    timed += 1
                    duration_sum += duration
                    if samples is not None:
                        counted_sum += duration
                        counted += samples
            previous = end
            append((step, duration, samples, size, eval_s, phases))  # type: ignore[arg-type]
        self._previous_end = previous
        if done:
            for window in (self._window, self._second):
                window.add_steps(len(done), timed, duration_sum, counted, counted_sum)
        return done

    def _phases(self, marks: StepMarks, eval_s: float) -> Phases | None:
        if marks.begin is None:
            return None
        span = training_time(elapsed(marks.begin, marks.end), eval_s)
        if span is None:
            return None
        phases = phases_of(marks, marks.begin, marks.end, span)
        if phases is not None:
            phases = with_comm(phases, self.comm_sample())
            self.anatomy.add(span, phases)
        return phases

    def _read_scalars(self) -> None:
        pending, tap = self._pending_scalars, self.tap
        while pending:
            name, captured = pending[0]
            values = read_values(captured)
            if values is None:
                break  # still being copied off the device; keep the order
            pending.popleft()
            finite = [v for v in values if math.isfinite(v)]
            if len(finite) < len(values):
                self._report_nonfinite(name, next(v for v in values if not math.isfinite(v)))
            if not finite:
                continue
            self.scalars[name] = finite[-1]
            total = math.fsum(finite)
            self._window.add_scalars(name, total, len(finite))
            self._second.add_scalars(name, total, len(finite))
            if tap is not None:
                tap.on_scalars(name, finite)

    def _report_nonfinite(self, name: str, value: float) -> None:
        if name in self._nonfinite_reported:
            return
        self._nonfinite_reported.add(name)
        self.add_event(
            Event(
                t=time.time(),
                step=self.step,
                kind="nonfinite_scalar",
                level="warning",
                message=f"{name} is {value} at step {self.step} (shown as a gap in the chart)",
                data={"name": name},
            )
        )

    # -- output -------------------------------------------------------------------------------

    def take_metrics(self, now: float, force: bool = False) -> Metrics | None:
        """The metrics of the window since the last call; ``None`` when there is nothing new
        and the last message is younger than the heartbeat interval (unless ``force``)."""
        window = self._window
        if not force and window.steps == 0 and now - self._last_emit < HEARTBEAT_INTERVAL_S:
            return None
        if window.step_time_s is not None:
            self.step_time_s = window.step_time_s
            self.samples_per_s = window.samples_per_s
        self._window = _Window()
        self._last_emit = now
        self._maybe_add_history_point(now)
        return Metrics(
            t=now,
            step=self.step,
            batch_size=self.batch_size,
            step_time_s=self.step_time_s,
            samples_per_s=self.samples_per_s,
            b_simple=self.noise.b_simple,
            samples=self.samples,
            samples_note=self.samples_note if self.samples_per_s is None else None,
            eval_s=self.eval_s,
            steps_in_window=window.steps,
            scalars=window.scalars() or {},
            noise=self.noise,
            idle_s=max(0.0, now - self.last_step_time) if self.step else None,
        )

    def _maybe_add_history_point(self, now: float) -> None:
        second = self._second
        if now - self._second_started < HISTORY_INTERVAL_S or second.steps == 0:
            return
        interval = self.anatomy.take_interval()
        self.history.append(
            MetricsPoint(
                t=now,
                step=self.step,
                steps=second.steps,
                batch_size=self.batch_size,
                step_time_s=second.step_time_s,
                samples_per_s=second.samples_per_s,
                samples=self.samples,
                scalars=second.scalars(),
                noise=self.noise if self.noise.b_simple is not None else None,
                anatomy=anatomy_of(interval, self.anatomy.clock) if interval else None,
            )
        )
        self._second = _Window()
        self._second_started = now
