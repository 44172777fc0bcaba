"""The step anatomy on the agent thread: the reading in each metrics message, its verdict,
an event when the verdict changes, and the sampling stride following the step time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec

from ..runtime.context import JobContext
from ..runtime.hot_path import NEVER, HotPath
from ..runtime.service import Extension, MetricsPart
from ..runtime.telemetry import Telemetry
from ..wire.protocol import Event, Metrics, StepAnatomy
from .marks import PhaseMarks
from .sampling import AnatomySampler
from .verdict import Judgement, LoaderFacts, VerdictKeeper, anatomy_notes, judge


class AnatomyExtension(Extension):
    def __init__(
        self,
        telemetry: Telemetry,
        *,
        world_size: int,
        ddp: bool | None = None,
        fsdp2: bool | None = None,
        loader: Callable[[], LoaderFacts | None],
        device_index: int | None,
        ctx: JobContext,
        sampler: AnatomySampler | None = None,
        phases: PhaseMarks | None = None,
        hot: HotPath | None = None,
    ) -> None:
        self._telemetry = telemetry
        self._sampler = sampler
        self._world_size = world_size
        self._ddp = ddp  # the job trains a DistributedDataParallel (distributed.ddp_of)
        self._fsdp2 = fsdp2  # the job is sharded by FSDP2 (distributed.fsdp2_of)
        self._loader = loader
        self._device_index = device_index
        self._step = ctx.progress
        self._phases = phases
        self._hot = hot
        self.keeper = VerdictKeeper()
        self.latest: StepAnatomy | None = None  # the last reading sent

    def at_boundary(self, step: int, now: float) -> int:
        """Whether step + 1 is one the anatomy samples (the hot path's ``sampling``): its
        marks armed if so; the next step to prepare."""
        phases, sampler, hot = self._phases, self._sampler, self._hot
        if phases is None or sampler is None or hot is None:
            return NEVER
        sampling = self._prepare(phases, sampler, step, now)
        hot.sampling = sampling
        return step + 1 if sampling else sampler.next_step - 1

    @staticmethod
    def _prepare(phases: PhaseMarks, sampler: AnatomySampler, step: int, now: float) -> bool:
        if not phases.installed:
            return False
        if not sampler.due(step + 1):
            phases.disarm()
            return False
        phases.arm(now)
        return phases.armed

    def metrics_part(self, metrics: Metrics) -> MetricsPart:
        if self._sampler is not None:
            self._sampler.follow_rate(metrics.step_time_s)
        reading = self._telemetry.anatomy.recent()
        if reading is None:
            return {}
        reading.notes = anatomy_notes(
            reading, self._world_size, self._ddp, self._fsdp2, self._collectives_why_not()
        )
        judgement = judge(reading, self._gpu_util(metrics), self._loader(), self._fsdp2)
        if self.keeper.update(judgement) and judgement is not None:
            self._announce(judgement)
        if (current := self.keeper.current) is not None:
            reading.verdict, reading.evidence, reading.advice = current
        self.latest = reading
        return {"anatomy": reading}

    def detach(self) -> None:
        """The phase marks' hooks come out."""
        if self._phases is not None:
            self._phases.remove()

    def latest_dict(self) -> dict[str, Any] | None:
        return msgspec.to_builtins(self.latest) if self.latest is not None else None

    def _collectives_why_not(self) -> str | None:
        collectives = self._phases.collectives if self._phases is not None else None
        return collectives.why_not if collectives is not None else None

    def _gpu_util(self, metrics: Metrics) -> float | None:
        if self._device_index is None:
            return None
        for device in metrics.devices:
            if device.index == self._device_index:
                return device.util_percent
        return None

    def _announce(self, judgement: Judgement) -> None:
        verdict, evidence, advice = judgement
        self._telemetry.add_event(
            Event(
                t=time.time(),
                step=self._step(),
                kind="step_anatomy",
                level="info" if verdict == "compute-bound" else "warning",
                message=f"{verdict}: {evidence}; try: {advice}",
                data={"verdict": verdict},
            )
        )
