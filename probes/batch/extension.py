"""Batch control on the agent thread: the wire commands that ask for a size or switch the
autopilot, the extension that feeds the controller (memory readings, what each change bought)
and puts the batch reading in every metrics message and hello, the autopilot's, and the
advisor's answer."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec

from ..runtime.devices import DeviceSample
from ..runtime.service import Extension, HelloPart, MetricsPart
from ..runtime.telemetry import Telemetry
from ..wire.describe import describe_advice
from ..wire.protocol import (
    Advice,
    AutopilotCommand,
    BatchChange,
    Command,
    Event,
    Hello,
    Metrics,
    SetBatchSize,
    StepBatchSize,
)
from ..wire.routing import CommandRouter
from .advisor import Advisor
from .autopilot import SETTLE_STEPS, Autopilot
from .control import BatchController
from .watch import LOSS

FASTEST_TICK_S = 0.005
SETTLED_WINDOWS = 3  # metrics windows a new advice holds before its event


class BatchExtension(Extension):
    """The agent-thread side of batch control: memory readings, what changes bought, and the
    batch reading in every metrics message and hello."""

    def __init__(
        self, controller: BatchController, telemetry: Telemetry, *, warn: Callable[[str, str], None]
    ) -> None:
        """``warn(kind, message)``: a warning event (``JobContext.warn``)."""
        self._controller = controller
        self._telemetry = telemetry
        self._warn = warn

    def on_record(self, record: object) -> None:
        if isinstance(record, BatchChange):
            self._controller.add_change(record)

    def on_tick(self, sample: DeviceSample) -> None:
        self._controller.observe_sample(sample, self._telemetry.step)

    def metrics_part(self, metrics: Metrics) -> MetricsPart:
        nonfinite = self._nonfinite_loss_since(self._controller.watch.watching_loss_since())
        for event in self._controller.observe_metrics(metrics, nonfinite):
            self._telemetry.add_event(event)
        return {"batch": self._controller.reading()}

    def _nonfinite_loss_since(self, step: int | None) -> bool:
        """A NaN/inf loss was logged after ``step`` (telemetry leaves them out of the window
        means and says so once, as an event)."""
        if step is None:
            return False
        for event in reversed(self._telemetry.events):
            if event.step <= step:
                return False
            if event.kind == "nonfinite_scalar" and event.data.get("name") == LOSS:
                return True
        return False

    def hello_part(self, hello: Hello) -> HelloPart:
        return {"batch": self._controller.reading()}

    def last_word(self) -> None:
        """A change accepted but never applied (the job ended before its boundary) is said."""
        if never := self._controller.unapplied():
            self._warn("batch_size_unapplied", never)


def register_commands(router: CommandRouter, controller: BatchController) -> None:
    def set_size(command: Command) -> dict[str, Any]:
        assert isinstance(command, SetBatchSize)
        return controller.request(
            command.value,
            confirm=command.confirm,
            reason=command.reason or "set from the monitor",
            source="monitor",
        )

    def step_size(command: Command) -> dict[str, Any]:
        assert isinstance(command, StepBatchSize)
        return controller.request_step(command.direction, confirm=command.confirm, source="monitor")

    router.register("set_batch_size", set_size)
    router.register("step_batch_size", step_size)


class AutopilotExtension(Extension):
    """The autopilot on the agent thread: it sees each batch change, decides on each metrics
    window (after the batch extension has fed the window to the controller's watch) and puts
    its reading in every metrics message and hello.

    While it ramps (``Autopilot.ramp_until``) its looks are paced by steps: on a loop that
    runs more than ``SETTLE_STEPS`` steps a tick, the agent ticks about every half that many
    steps, and a device sample is asked for as soon as a new size has run (the sampler's own
    interval is a second). On a CPU's 1 ms steps a tick is 250 steps, a second 1,000: the
    ramp would cost more steps at small sizes than a tuned fixed batch needs in all. On a
    GPU's 50 ms steps nothing changes."""

    def __init__(
        self,
        autopilot: Autopilot,
        controller: BatchController,
        sample_soon: Callable[[], None],
        report: Callable[[str, BaseException], None] = lambda _where, _exc: None,
    ) -> None:
        """``report``: where a failure of its last word goes (the fault guard)."""
        self._autopilot = autopilot
        self._report = report
        self._controller = controller
        self._sample_soon = sample_soon
        self._step = 0
        self._step_time_s: float | None = None

    def on_tick(self, sample: DeviceSample) -> None:
        if self._autopilot.state == "on" and not self._controller.sampled_since_switch:
            self._sample_soon()

    def next_tick_s(self) -> float | None:
        autopilot = self._autopilot
        if autopilot.state != "on" or self._step >= autopilot.ramp_until:
            return None
        if self._step_time_s is None:
            return None
        return max(FASTEST_TICK_S, self._step_time_s * SETTLE_STEPS / 2)

    def on_record(self, record: object) -> None:
        if isinstance(record, BatchChange):
            self._autopilot.on_change(record)

    def metrics_part(self, metrics: Metrics) -> MetricsPart:
        self._step, self._step_time_s = metrics.step, metrics.step_time_s
        self._autopilot.on_metrics(metrics)
        return {"autopilot": self._autopilot.reading()}

    def hello_part(self, hello: Hello) -> HelloPart:
        return {"autopilot": self._autopilot.reading()}

    def last_word(self) -> None:
        """Where it took the batch, and its claim (``Autopilot.finish``)."""
        try:
            self._autopilot.finish()
        except Exception as exc:  # its last word is not worth the job's clean end
            self._report("the autopilot's last word", exc)


def register_autopilot(router: CommandRouter, autopilot: Autopilot) -> None:
    def switch(command: Command) -> dict[str, Any]:
        assert isinstance(command, AutopilotCommand)
        return msgspec.to_builtins(autopilot.switch(command.on))

    router.register("autopilot", switch)


class AdvisorExtension(Extension):
    """The advisor on the agent thread, after the autopilot (which asks it first when it is on):
    its answer in every metrics message and hello, an ``advice`` event when a new answer has
    held for ``SETTLED_WINDOWS`` windows (one that flips at the threshold window by window is
    not news each time; a divergence's "back" is said at once), and its final word at the
    job's end."""

    def __init__(self, advisor: Advisor, emit: Callable[[Event], None]) -> None:
        self._advisor = advisor
        self._emit = emit
        self._said: tuple[str, int] | None = None
        self._new: tuple[str, int] | None = None  # an answer not said yet, and how long it held
        self._held = 0

    def metrics_part(self, metrics: Metrics) -> MetricsPart:
        latest = self._advisor.latest
        if latest is None or latest.step != metrics.step:
            latest = self._advisor.advise(metrics.noise, metrics.step)
        answer = (latest.action, latest.batch_size)
        self._held = self._held + 1 if answer == self._new else 1
        self._new = answer
        settled = self._held >= SETTLED_WINDOWS or latest.action == "back"
        if answer != self._said and settled:
            self._said = answer
            self._say(latest, "advice")
        return {"advice": latest}

    def hello_part(self, hello: Hello) -> HelloPart:
        return {"advice": self._advisor.latest}

    def last_word(self) -> None:
        """The advice as the job ends: the summary's final word."""
        if (latest := self._advisor.latest) is not None:
            self._say(latest, "final word", final=True)

    def _say(self, advice: Advice, lead: str, final: bool = False) -> None:
        data: dict[str, Any] = {"advice": msgspec.to_builtins(advice)}
        if final:
            data["final"] = True
        self._emit(
            Event(
                t=time.time(),
                step=advice.step,
                kind="advice",
                message=describe_advice(advice, lead),
                data=data,
            )
        )
