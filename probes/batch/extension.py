"""Batch control on the agent thread: the wire commands that ask for a size or switch the
autopilot, the extension that feeds the controller (memory readings, what each change bought)
and puts the batch reading in every metrics message and hello, and the autopilot's."""

from __future__ import annotations

from typing import Any

import msgspec

from ..runtime.devices import DeviceSample
from ..runtime.service import Extension, HelloPart, MetricsPart
from ..runtime.telemetry import Telemetry
from ..wire.protocol import (
    AutopilotCommand,
    BatchChange,
    Command,
    Hello,
    Metrics,
    SetBatchSize,
    StepBatchSize,
)
from ..wire.routing import CommandRouter
from .autopilot import Autopilot
from .control import BatchController
from .watch import LOSS


class BatchExtension(Extension):
    """The agent-thread side of batch control: memory readings, what changes bought, and the
    batch reading in every metrics message and hello."""

    def __init__(self, controller: BatchController, telemetry: Telemetry) -> None:
        self._controller = controller
        self._telemetry = telemetry

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
    its reading in every metrics message and hello."""

    def __init__(self, autopilot: Autopilot) -> None:
        self._autopilot = autopilot

    def on_record(self, record: object) -> None:
        if isinstance(record, BatchChange):
            self._autopilot.on_change(record)

    def metrics_part(self, metrics: Metrics) -> MetricsPart:
        self._autopilot.on_metrics(metrics)
        return {"autopilot": self._autopilot.reading()}

    def hello_part(self, hello: Hello) -> HelloPart:
        return {"autopilot": self._autopilot.reading()}


def register_autopilot(router: CommandRouter, autopilot: Autopilot) -> None:
    def switch(command: Command) -> dict[str, Any]:
        assert isinstance(command, AutopilotCommand)
        return msgspec.to_builtins(autopilot.switch(command.on))

    router.register("autopilot", switch)
