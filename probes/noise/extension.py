"""The noise scale's tie to the agent: ``NoiseExtension`` arms the measured steps at the
scheduled boundaries before them (training thread), runs ``NoiseScale.agent_tick`` on each
tick and hands its reading to the metrics message (agent thread)."""

from __future__ import annotations

import dataclasses

from ..runtime.devices import DeviceSample
from ..runtime.hot_path import NEVER, HotPath
from ..runtime.service import Extension, MetricsPart
from ..runtime.steps import StepRun
from ..runtime.telemetry import Telemetry
from ..wire.protocol import Metrics
from .controller import NoiseScale
from .shared_backward import SharedBackward


@dataclasses.dataclass(eq=False, repr=False)
class NoiseExtension(Extension):
    """Runs ``NoiseScale.agent_tick`` on the agent thread, before each metrics message, and
    arms the measured steps at the scheduled boundaries before them."""

    noise: NoiseScale
    telemetry: Telemetry
    hot: HotPath
    shared: SharedBackward | None = None

    def at_boundary(self, step: int, _now: float) -> int:
        """Whether step + 1 is measured (the hot path's ``noise_due``): its hooks, and the
        shared-backward watch, on if so; the next step to prepare."""
        noise, shared = self.noise, self.shared
        due = noise.due(step + 1)
        if due:
            noise.arm()
        if shared is not None:
            if shared.armed:
                shared.step_ended()
            if due and noise.source is not None:
                shared.arm()
            else:
                shared.disarm()
        self.hot.noise_due = due
        if due:
            return step + 1
        return noise.next_measured - 1 if noise.source is not None else NEVER

    def on_steps(self, run: StepRun) -> None:
        """The steps' durations price the budget (``NoiseScale.on_durations``)."""
        self.noise.on_durations(run)

    def on_tick(self, sample: DeviceSample) -> None:
        self.noise.agent_tick(self.telemetry)

    def detach(self) -> None:
        """The shared-backward watch's hooks, then the estimate's own (its source's)."""
        if self.shared is not None:
            self.shared.remove()
        self.noise.close()

    def metrics_part(self, metrics: Metrics) -> MetricsPart:
        """The reading this tick's ``agent_tick`` made (first in: the autopilot reads it)."""
        reading = self.noise.reading
        return {"b_simple": reading.b_simple, "noise": reading}
