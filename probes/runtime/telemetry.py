"""Aggregation on the agent thread: step records in, metrics windows and history points out.

The training thread only appends small records to an inbox (``inbox``); everything here runs
later, on the agent thread, so its cost never lands on a training step.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from itertools import compress, count, repeat
from operator import is_not, sub
from typing import Any, NamedTuple, Protocol

from ..anatomy.marks import StepMarks
from ..anatomy.phases import phases_of, with_comm
from ..anatomy.seconds import Phases
from ..anatomy.window import PhaseWindow, anatomy_of
from ..record.history import DecimatingHistory, metrics_history
from ..wire.describe import batch_varies
from ..wire.protocol import Event, Metrics, MetricsPoint, NoiseScaleReading
from .inbox import Flush, Inbox, StepColumns, take_all
from .logged import LoggedIntake
from .losses import BackwardLosses, LossUnits
from .samples import StepTally
from .steps import StepRun
from .timing import (
    Captured,
    CudaMark,
    ScalarError,
    capture_run,
    capture_scalar,
    elapsed,
    read_values,
)
from .window import StepWindow, timed_sums, training_time

HISTORY_INTERVAL_S = 1.0
HEARTBEAT_INTERVAL_S = 1.0
EVENT_BACKLOG = 500


def sampled_indices(per_step: list[Any]) -> Iterator[int]:
    """The indices of the sampled steps, those whose item (marks, phases) is not None, found
    in one C loop."""
    return compress(count(), map(is_not, per_step, repeat(None)))


def _ready(taken: _Steps) -> int:
    """How many of ``taken`` lead up to the first sampled step whose device work is still
    running."""
    if taken.marks is None:
        return len(taken.ends)
    for index in sampled_indices(taken.marks):
        mark = taken.marks[index].end
        if isinstance(mark, CudaMark) and not mark.event.query():
            return index
    return len(taken.ends)


class _Steps(NamedTuple):
    """Steps taken in, as columns, waiting for their durations (and the sampled steps' phase
    marks): ``marks`` is None when none of them was sampled."""

    steps: range
    ends: list[float]  # the post-hook's perf_counter: durations are the differences
    samples: list[int | None]
    sizes: list[int | None]
    eval_s: list[float]
    marks: list[Any] | None

    def split(self, at: int) -> tuple[_Steps, _Steps]:
        head = _Steps(*(column[:at] if column is not None else None for column in self))
        tail = _Steps(*(column[at:] if column is not None else None for column in self))
        return head, tail


class StepTap(Protocol):
    def on_steps(self, run: StepRun) -> None: ...
    def on_scalars(self, name: str, values: list[float]) -> None: ...


class Telemetry:
    def __init__(self, history_capacity: int = 2048) -> None:
        self.step = 0
        self.samples: int | None = 0  # None once a step's samples could not be counted
        self.samples_note: str | None = None  # why they are not counted (set by the monitor)
        self.batch_size: int | None = None
        self.batch_varies: str | None = None  # the size changes step to step: its range
        self.last_step_time = 0.0
        self.step_time_s: float | None = None
        self.samples_per_s: float | None = None
        self.scalars: dict[str, float] = {}
        self.history: DecimatingHistory[MetricsPoint] = metrics_history(history_capacity)
        self.events: deque[Event] = deque(maxlen=EVENT_BACKLOG)
        self.tally = StepTally()
        self._steps: deque[_Steps] = deque()  # taken in, their durations still to resolve
        self._marks: list[tuple[int, Any]] = []  # the anatomy's sampled steps: (step, marks)
        self._previous_end: float | None = None  # the previous step's end (perf_counter)
        self.anatomy = PhaseWindow()
        self.comm_sample: Callable[[], float | None] = lambda: None  # DDP's latest wait
        self.eval_s = 0.0  # evaluation time inside the loop so far, kept out of step times
        self._logged: dict[str, list[object]] = {}  # this tick's mon.log values by name
        self.logged_intake = LoggedIntake()
        self._losses = BackwardLosses()  # this tick's tensors backward() was called on
        self.loss_units = LossUnits()  # whether the loss sums over the batch
        # where the values read go to be freed (the training thread: ``HotPath.hand_back``)
        self.hand_back: Callable[[list[Any], int], None] = lambda _values, _steps: None
        self._handed_back_at = 0  # the step when the last values read were handed back
        self._pending_scalars: deque[tuple[str, Captured | list[float]]] = deque()
        self._window = StepWindow()
        self._second = StepWindow()
        self._second_started = time.time()
        self._last_emit = 0.0
        self._nonfinite_reported: set[str] = set()
        self.new_events: list[Event] = []
        self.flushes: list[threading.Event] = []  # to set once this tick's output is sent
        # the recorder: on_steps(StepRun), on_scalars(name, values), a poll's worth at a time
        self.tap: StepTap | None = None
        self._readers: tuple[Callable[[StepRun], None], ...] = ()  # the extensions' on_steps
        # where a bad mon.log value is reported
        self.report: Callable[[str, BaseException], None] = lambda _where, _exc: None
        # why a step's samples are unknown (None: they are not; called once per session)
        self.samples_reason: Callable[[int], str | None] = lambda _step: None

    # -- ingest (agent thread) ----------------------------------------------------------------

    def drain(self, inbox: Inbox, other: Callable[[object], None]) -> None:
        """Take everything in ``inbox``: its general records in order (one that is not
        telemetry's goes to ``other``, the extensions), then the tick's steps, logged values
        and losses, each kind as columns: on a host-bound job's small steps the training
        thread waits for the agent thread's Python per step (they share the GIL)."""
        self._take_records(inbox.records, other)
        ring = inbox.ring
        columns = ring.take()
        if ring.marks:  # taken after the steps: a mark may be of a step written since
            self._marks.extend(take_all(ring.marks))
        steps = 0
        if columns is not None:
            steps = len(columns.ends)
            self._take_steps(columns)
        losses = take_all(inbox.losses) if inbox.losses else []
        note = self.logged_intake.take(inbox, steps, self._logged, self.step, len(losses))
        if note is not None:
            self.add_event(note)
        self._losses.take(losses)
        if inbox.latest_loss:
            self._losses.take_latest(inbox.latest_loss[0])
        if self._logged or self._losses.tick:
            self._capture_scalars()
            self._take_records(inbox.records, other)  # the events of bad values, at once

    def _take_records(self, records: deque[Any], other: Callable[[object], None]) -> None:
        for record in take_all(records):
            if isinstance(record, Event):
                self.add_event(record)
            elif isinstance(record, Flush):
                self.flushes.append(record.done)
            else:
                other(record)

    def _take_steps(self, columns: StepColumns) -> None:
        ends, eval_s = columns.ends, columns.eval_s
        steps = range(columns.first, columns.first + len(ends))
        samples, sizes = self.tally.resolve_all(
            columns.drawn, columns.first_batch, columns.examples, columns.declared
        )
        try:
            self.samples = (self.samples or 0) + sum(samples)  # type: ignore[arg-type]
        except TypeError:  # a step whose samples are unknown (None)
            for step, step_samples in zip(steps, samples, strict=True):
                if step_samples is None:
                    self._uncounted(step)
                else:
                    self.samples = (self.samples or 0) + step_samples
        self.step = steps[-1]
        self._take_size(sizes[-1])
        self.tally.follow_rate(len(ends) - 1, ends[-1] - ends[0])
        self.last_step_time = ends[-1] + time.time() - time.perf_counter()
        if any(eval_s):
            self.eval_s += sum(eval_s)
        step_marks = None
        if self._marks:
            step_marks, self._marks = self._marks_of(steps, self._marks)
        self._steps.append(_Steps(steps, ends, samples, sizes, eval_s, step_marks))

    def _take_size(self, size: int | None) -> None:
        """The batch size shown: the steps' nominal size, or while the examples per step vary
        (``NominalBatch``) the last step's, marked with their recent range."""
        nominal = self.tally.nominal
        span = nominal.range if size is None else None
        self.batch_size = nominal.last if span is not None else size
        self.batch_varies = batch_varies(span)

    @staticmethod
    def _marks_of(steps: range, marks: list[tuple[int, Any]]) -> tuple[list[Any], list[tuple]]:
        """The sampled steps' marks laid out by ``steps``, and those of steps still to come
        (the marks of steps the ring lost are dropped with them)."""
        laid_out: list[Any] = [None] * len(steps)
        later = []
        for step, mark in marks:
            if step > steps[-1]:
                later.append((step, mark))
            elif step >= steps.start:
                laid_out[step - steps.start] = mark
        return laid_out, later

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
        losses = self._losses.pop()
        if (said := self.loss_units.read(losses or logged.get("loss", []), self.step)) is not None:
            self.add_event(said)
        if losses:
            run = capture_run(losses)
            if run is not None:
                pending.append(("loss", run))
            else:
                for loss in losses:
                    self._capture_loss(loss)
        for values in logged.values():
            losses += values
        self.hand_back(losses, self.step - self._handed_back_at)
        self._handed_back_at = self.step

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

    def read_steps_by(self, readers: Iterable[Callable[[StepRun], None]]) -> None:
        """Each run of resolved steps goes to ``readers`` (extensions' on_steps), then the tap."""
        self._readers = tuple(readers)

    def poll(self) -> None:
        """Resolve whatever durations and scalars have become readable."""
        for run in self._resolve_steps():
            for reader in self._readers:
                reader(run)
            if self.tap is not None:
                self.tap.on_steps(run)
        self._read_scalars()

    def _resolve_steps(self) -> list[StepRun]:
        """The steps taken in whose durations are known now, in order, added to the windows,
        as runs of columns for those who read steps one by one (none when no one does). A
        sampled step whose device work is still running keeps the order: the steps after it
        wait too."""
        done: list[StepRun] = []
        pending = self._steps
        while pending:
            ready = _ready(pending[0])
            if ready == len(pending[0].ends):
                done += self._resolve(pending.popleft())
                continue
            if ready:
                head, pending[0] = pending[0].split(ready)
                done += self._resolve(head)
            break
        return done

    def _resolve(self, taken: _Steps) -> list[StepRun]:
        ends, eval_s = taken.ends, taken.eval_s
        previous = self._previous_end
        self._previous_end = ends[-1]
        durations: list[float | None] = list(map(sub, ends[1:], ends[:-1]))
        durations.insert(0, ends[0] - previous if previous is not None else None)
        if any(eval_s):
            durations = list(map(training_time, durations, eval_s))
        phases: list[Phases | None] | None = None
        if (marks := taken.marks) is not None:  # the sampled steps only: a few a tick
            phases = [None] * len(ends)
            for index in sampled_indices(marks):
                phases[index] = self._phases(marks[index], eval_s[index])
        timed, duration_sum, counted, counted_sum = timed_sums(durations, taken.samples)
        for window in (self._window, self._second):
            window.add_steps(len(ends), timed, duration_sum, counted, counted_sum)
        if not self._readers and self.tap is None:
            return []  # no one reads the steps one by one
        return [StepRun(taken.steps, durations, taken.samples, taken.sizes, eval_s, phases)]

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
            total = math.fsum(values)  # not finite: a NaN or an infinity among them
            finite = values
            if not math.isfinite(total):
                finite = [v for v in values if math.isfinite(v)]
                if len(finite) < len(values):
                    bad = next(v for v in values if not math.isfinite(v))
                    self._report_nonfinite(name, bad)
                if not finite:
                    continue
                total = math.fsum(finite)
            self.scalars[name] = finite[-1]
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
        self._window = StepWindow()
        self._last_emit = now
        return Metrics(
            t=now,
            step=self.step,
            batch_size=self.batch_size,
            batch_varies=self.batch_varies,
            step_time_s=self.step_time_s,
            samples_per_s=self.samples_per_s,
            b_simple=None,  # the noise scale's part
            samples=self.samples,
            samples_note=self.samples_note if self.samples_per_s is None else None,
            eval_s=self.eval_s,
            steps_in_window=window.steps,
            scalars=window.scalars() or {},
            scalar_notes=dict(self.loss_units.notes),
            idle_s=max(0.0, now - self.last_step_time) if self.step else None,
        )

    def keep_history(self, now: float, metrics: Metrics) -> None:
        """A point of the ~1 s history once a second, from the message just made (every
        extension's part in: the noise scale's reading)."""
        noise = metrics.noise if metrics.noise.b_simple is not None else None
        self._maybe_add_history_point(now, noise)

    def _maybe_add_history_point(self, now: float, noise: NoiseScaleReading | None) -> None:
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
                noise=noise,
                anatomy=anatomy_of(interval, self.anatomy.clock) if interval else None,
            )
        )
        self._second = StepWindow()
        self._second_started = now
