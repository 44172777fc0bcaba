"""The training thread's scheduled slow path: what runs at the end of the steps the hot path
was asked for (``runtime.hot_path.StepWork.on_boundary``), never on an ordinary step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..anatomy.marks import PhaseMarks
from ..anatomy.sampling import AnatomySampler
from ..batch.control import BatchController
from ..noise import NoiseScale
from ..noise.autograd import ExampleCounter
from ..noise.shared_backward import SharedBackward
from ..runtime.forward_watch import ForwardWatch
from ..runtime.hot_path import NEVER, HotPath
from ..runtime.ranks import DDP_SAMPLE_EVERY, DdpTiming
from ..runtime.samples import CHECK_EVERY
from ..runtime.telemetry import Telemetry


class Boundary:
    """``at_boundary(step, now)``: apply what is due, get the next step ready, and say the
    next step whose end needs it."""

    def __init__(
        self,
        *,
        control: BatchController | None,
        ddp_timing: DdpTiming,
        watch: ForwardWatch,
        telemetry: Telemetry,
        examples: ExampleCounter,
        noise: NoiseScale,
        shared: SharedBackward | None,
        phases: PhaseMarks | None,
        sampler: AnatomySampler,
        hot: HotPath,
    ) -> None:
        self._control = control
        self._ddp_timing = ddp_timing
        self._watch = watch
        self._telemetry = telemetry
        self._examples = examples
        self._noise = noise
        self._shared = shared
        self._phases = phases
        self._sampler = sampler
        self._hot = hot
        self.listeners: list[Callable[[bool], None]] = []

    def at_boundary(self, step: int, now: float) -> int:
        """The slow path at the end of ``step``: apply what is due and get the next step
        ready; returns the next step whose end needs it."""
        control = self._control
        following = control.at_boundary(step, now) if control is not None else NEVER
        if self._ddp_timing.model is not None:
            self._ddp_timing.at_step(step)
            following = min(following, (step // DDP_SAMPLE_EVERY + 1) * DDP_SAMPLE_EVERY)
        if not self._watch.armed:
            self._watch.arm()
        following = min(following, self._prepare_example_count(step, control))
        intake = self._telemetry.logged_intake
        if intake.timing_start and (logging_next := intake.early(step, now)) is not None:
            following = min(following, logging_next)
        noise_due = self._prepare_noise(step)
        sampling = self._prepare_anatomy(step, now)
        hot = self._hot
        hot.noise_due, hot.sampling = noise_due, sampling
        hot.need_pre_hook(noise_due or sampling)
        for listener in self.listeners:
            listener(sampling)
        if noise_due or sampling:
            return min(following, step + 1)
        noise_next = self._noise.next_measured - 1 if self._noise.source is not None else NEVER
        anatomy_next = self._sampler.next_step - 1 if self._phases is not None else NEVER
        return min(following, noise_next, anatomy_next)

    def _prepare_example_count(self, step: int, control: Any) -> int:
        """Count the model's examples on step + 1 if nothing else says its samples (no
        DataLoader, no declared size), and the step the count next changes at."""
        tally, counter = self._telemetry.tally, self._examples
        wanted = control is None and tally.counts_model_examples(step + 1)
        if wanted is not counter.wanted:
            counter.want(wanted)
        if control is not None or tally.batches_seen:
            return NEVER
        if wanted and tally.steady is not None:
            return step + 1  # a check: off again after it
        # until the count is steady, look again every CHECK_EVERY steps (the checks' stride,
        # a larger power of two once the rate is known, is a multiple of it)
        every = tally.check_every if tally.steady is not None else CHECK_EVERY
        return (step // every + 1) * every - 1  # the next check, or steadiness

    def _prepare_noise(self, step: int) -> bool:
        """Whether step + 1 is measured; its hooks (and the shared-backward watch) on if so."""
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
        return due

    def _prepare_anatomy(self, step: int, now: float) -> bool:
        """Whether step + 1 is one the anatomy samples; its marks armed if so."""
        phases = self._phases
        if phases is None or not phases.installed:
            return False
        if not self._sampler.due(step + 1):
            phases.disarm()
            return False
        phases.arm(now)
        return phases.armed
