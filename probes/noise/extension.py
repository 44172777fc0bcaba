"""The noise scale's tie to the agent: ``NoiseExtension`` arms the measured steps at the
scheduled boundaries before them (training thread), runs ``NoiseScale.agent_tick`` on each
tick and hands its reading to the metrics message (agent thread)."""

from __future__ import annotations

from ..runtime.devices import DeviceSample
from ..runtime.hot_path import NEVER, HotPath
from ..runtime.service import Extension, MetricsPart
from ..runtime.steps import StepRun
from ..runtime.telemetry import Telemetry
from ..wire.protocol import Metrics
from .controller import NoiseScale
from .shared_backward import SharedBackward


class NoiseExtension(Extension):
    """Runs ``NoiseScale.agent_tick`` on the agent thread, before each metrics message, and
    arms the measured steps at the scheduled boundaries before them."""

    def __init__(
        self,
        noise: NoiseScale,
        telemetry: Telemetry,
        *,
        hot: HotPath,
        shared: SharedBackward | None = None,
    ) -> None:
        self._noise = noise
        self._telemetry = telemetry
        self._hot = hot
        self._shared = shared

    def at_boundary(self, step: int, _now: float) -> int:
        """Whether step + 1 is measured (the hot path's ``noise_due``): its hooks, and the
        shared-backward watch, on if so; the next step to prepare."""
        noise, shared = self._noise, self._shared
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
        self._hot.noise_due = due
        if due:
            return step + 1
        return noise.next_measured - 1 if noise.source is not None else NEVER

    def on_steps(self, run: StepRun) -> None:
        """The steps' durations price the budget (``NoiseScale.on_durations``)."""
        self._noise.on_durations(run)

    def on_tick(self, sample: DeviceSample) -> None:
        self._noise.agent_tick(self._telemetry)

    def detach(self) -> None:
        """The shared-backward watch's hooks, then the estimate's own (its source's)."""
        if self._shared is not None:
            self._shared.remove()
        self._noise.close()

    def metrics_part(self, metrics: Metrics) -> MetricsPart:
        """The reading this tick's ``agent_tick`` made (first in: the autopilot reads it)."""
        reading = self._noise.reading
        return {"b_simple": reading.b_simple, "noise": reading}
