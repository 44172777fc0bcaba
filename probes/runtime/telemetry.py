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
from typing import Protocol

from ..anatomy.phases import phases_of, with_comm
from ..anatomy.window import PhaseWindow, anatomy_of
from ..record.format import StepDone
from ..record.history import DecimatingHistory, metrics_history
from ..wire.protocol import Event, Metrics, MetricsPoint, NoiseScaleReading
from .hot_path import LOGGED, LOSS, LOSS_GIVEN, STEP
from .inbox import Flush, StepEnded
from .samples import StepTally
from .timing import Captured, CudaMark, ScalarError, capture_scalar, elapsed, read_scalar

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
    def on_step(self, done: StepDone) -> None: ...
    def on_scalar(self, name: str, value: float) -> None: ...


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

    def add_step(self, duration: float | None, samples: int | None) -> None:
        self.steps += 1
        if duration is not None and duration > 0:
            self.timed_steps += 1
            self.duration_s += duration
            if samples is not None:
                self.counted_s += duration
                self.timed_samples += samples

    def add_scalar(self, name: str, value: float) -> None:
        self.scalar_sums[name] = self.scalar_sums.get(name, 0.0) + value
        self.scalar_counts[name] = self.scalar_counts.get(name, 0) + 1

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
        self._steps: deque[StepEnded] = deque()  # taken in, waiting for their phase marks
        self._previous_end: float | None = None  # the previous step's end (perf_counter)
        self.anatomy = PhaseWindow()
        self.comm_sample: Callable[[], float | None] = lambda: None  # DDP's latest wait
        self.eval_s = 0.0  # evaluation time inside the loop so far, kept out of step times
        self._pending_scalars: deque[tuple[str, Captured]] = deque()
        self._window = _Window()
        self._second = _Window()
        self._second_started = time.time()
        self._last_emit = 0.0
        self._nonfinite_reported: set[str] = set()
        self.new_events: list[Event] = []
        self.flushes: list[threading.Event] = []  # to set once this tick's output is sent
        # Sees every resolved step and scalar (agent thread): on_step(StepDone) and
        # on_scalar(name, value). The session recorder uses it.
        self.tap: StepTap | None = None
        self.duration_listeners: list[Callable[[int, float | None], None]] = []
        self._loss_given = False  # a LOSS_GIVEN came: the LOSS after it is left out
        self.report: Callable[[str, BaseException], None] = _no_report  # a bad mon.log value
        # why a step's samples are unknown (None: they are not; called once per session)
        self.samples_reason: Callable[[int], str | None] = lambda _step: None

    # -- ingest (agent thread) ----------------------------------------------------------------

    def ingest(self, record: object) -> bool:
        """Take one inbox record; False: not one of telemetry's (it goes to the extensions)."""
        if type(record) is tuple:
            kind = record[0]
            if kind == STEP:
                self._add_step(record)
            elif kind == LOGGED:
                self._capture(record[2])
            elif kind == LOSS:
                if self._loss_given:  # the backward() inside the framework's: not the loss
                    self._loss_given = False
                else:
                    self._capture_loss(record[2])
            elif kind == LOSS_GIVEN:
                self._capture_loss(record[2])
                self._loss_given = True
            else:
                return False
        elif isinstance(record, Event):
            self.add_event(record)
        elif isinstance(record, Flush):
            self.flushes.append(record.done)
        else:
            return False
        return True

    def _add_step(self, record: tuple) -> None:
        """A step the hot path recorded: ``(STEP, step, end, taken, model_examples, declared,
        eval_s, marks)`` (see ``runtime.hot_path.HotPath._post_hook``)."""
        _, step, end, taken, model_examples, declared, eval_s, marks = record
        samples, size = self.tally.resolve(taken, model_examples, declared)
        self.step = step
        if samples is not None:
            self.samples = (self.samples or 0) + samples
        else:
            if not self.samples:
                self.samples = None  # nothing counted yet: unknown, not zero
            if self.samples_note is None:
                self.samples_note = self.samples_reason(step)
        self.batch_size = size
        self.last_step_time = wall = time.time() - (time.perf_counter() - end)
        self._steps.append(StepEnded(step, wall, end, samples, size, eval_s, marks))
        self.eval_s += eval_s

    def _capture(self, scalars: dict[str, object]) -> None:
        for name, value in scalars.items():
            try:
                self._pending_scalars.append((name, capture_scalar(name, value)))
            except (ScalarError, RuntimeError) as exc:
                self.report(f"log({name}=...)", exc)

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
        tap = self.tap
        steps = self._steps
        while steps:
            ended = steps[0]
            marks = ended.marks
            end = marks.end if marks is not None else None
            if isinstance(end, CudaMark) and not end.event.query():
                break  # the sampled step's device work is still running; keep the order
            steps.popleft()
            previous, self._previous_end = self._previous_end, ended.end
            duration = (
                training_time(ended.end - previous, ended.eval_s) if previous is not None else None
            )
            self._window.add_step(duration, ended.samples)
            self._second.add_step(duration, ended.samples)
            for listener in self.duration_listeners:
                listener(ended.step, duration)
            phases = None
            if marks is not None and marks.begin is not None:
                span = training_time(elapsed(marks.begin, marks.end), ended.eval_s)
                if span is not None:
                    phases = phases_of(marks, marks.begin, marks.end, span)
                if phases is not None:
                    phases = with_comm(phases, self.comm_sample())
                    self.anatomy.add(span, phases)  # type: ignore[arg-type]
            if tap is not None:
                tap.on_step(
                    StepDone(
                        ended.step,
                        duration,
                        ended.samples,
                        ended.batch_size,
                        ended.eval_s,
                        phases,
                    )
                )
        while self._pending_scalars:
            name, captured = self._pending_scalars[0]
            value = read_scalar(captured)
            if value is None:
                break
            self._pending_scalars.popleft()
            if not math.isfinite(value):
                self._report_nonfinite(name, value)
                continue
            self.scalars[name] = value
            self._window.add_scalar(name, value)
            self._second.add_scalar(name, value)
            if tap is not None:
                tap.on_scalar(name, value)

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
