"""A simulated job for the autopilot's and the advisor's tests: a real BatchController and
Autopilot (with its Advisor), fed metrics windows whose step time follows t(B) = c(B½ + B) and
whose noise-scale reading the test chooses."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

from bsmon.probes.batch.advisor import Advisor
from bsmon.probes.batch.autopilot import Autopilot
from bsmon.probes.batch.control import BatchController
from bsmon.probes.batch.extension import AdvisorExtension, AutopilotExtension
from bsmon.probes.batch.policy import BatchPolicy
from bsmon.probes.batch.regather import RegatherCost
from bsmon.probes.runtime.devices import DeviceSample
from bsmon.probes.runtime.fault_guard import FaultGuard
from bsmon.probes.wire.protocol import (
    Advice,
    BatchChange,
    Capability,
    Event,
    HostReading,
    Metrics,
    NoiseScaleReading,
)

Noise = Callable[[int], NoiseScaleReading]


def tight(phi: float, spread: float = 0.1) -> Noise:
    """A resolved estimate: φ with a 95% interval of ±``spread``."""
    reading = NoiseScaleReading(b_simple=phi, ci_low=phi * (1 - spread), ci_high=phi * (1 + spread))
    return lambda _step: reading


class Job:
    """A training job as the agent sees it: steps in windows, a batch size that changes at
    step boundaries, the extensions' order (the batch watch first, then the autopilot's
    extension, which asks for device samples into ``samples_asked``, then the advisor's)."""

    def __init__(
        self,
        *,
        size: int = 16,
        half: float = 64.0,
        c: float = 1e-5,
        noise: Noise | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        lr_scaling: str | None = "auto",
        scheduler: object = None,
        max_size: int | None = None,
        declared_half: float | None = None,
        on: bool = True,
        epoch_steps: int = 100,
        scheduler_every: int | None = None,
        plain_step_s: float | None = None,
        micro_batch_size: int | None = None,
        regather: RegatherCost | None = None,
    ) -> None:
        """``scheduler_every``: ``scheduler.step()`` every that many steps (an epoch is
        ``epoch_steps`` steps of its DataLoader); ``micro_batch_size``: accumulation mode;
        ``regather``: the advisor's price of growing by accumulation (a sharded job)."""
        self.step, self.t = 0, 1000.0
        self.scheduler, self.scheduler_every = scheduler, scheduler_every
        self.half, self.c, self.noise = half, c, noise or tight(1000.0)
        self.events: list[Event] = []
        self.optimizer = optimizer or torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
        self.control = BatchController(
            initial=size,
            policy=BatchPolicy(max_size=max_size, multiple_of=micro_batch_size or 1),
            micro_batch_size=micro_batch_size,
            optimizer=self.optimizer,
            lr_scaling=lr_scaling,
            scheduler=scheduler,
            emit=self.events.append,
            record=self._applied,
            guard=FaultGuard(lambda _event: None, lambda: 0),
            step=lambda: self.step,
            noise_scale=lambda: self.noise(self.step).b_simple,
        )
        self.switched_at = time.time()  # the controller's start counts as a switch
        self.stale_sample = DeviceSample(
            devices=[], gpu=Capability(False, "no GPU"), host=HostReading(), t=0.0
        )
        self.autopilot = Autopilot(
            self.control,
            noise_refusal=lambda: None,
            emit=self.events.append,
            step=lambda: self.step,
            declared_half=declared_half,
            epochs=lambda: self.step // epoch_steps + 1,
            plain_step_s=lambda: plain_step_s,
            advisor=Advisor(self.control, declared_half=declared_half, regather=regather),
        )
        self.samples_asked: list[int] = []
        self.samples = 0  # the job's examples so far
        self.extension = AutopilotExtension(
            self.autopilot, self.control, lambda: self.samples_asked.append(self.step)
        )
        self.advisor_extension = AdvisorExtension(self.autopilot.advisor, self.events.append)
        self.advice: Advice | None = None  # the advisor's answer in the latest window
        self.sizes: list[int] = []
        if on:
            self.autopilot.switch(True)

    def _applied(self, change: BatchChange) -> None:
        self.switched_at = change.t
        self.control.add_change(change)
        self.autopilot.on_change(change)

    def step_time(self, size: int) -> float:
        return self.c * (self.half + size)

    def run(
        self,
        windows: int,
        steps: int = 10,
        loss: Callable[[int], float] = lambda _s: 1.0,
        sampled: bool = True,
    ):
        """``windows`` metrics windows of ``steps`` steps; ``sampled``: the device sampler's
        reading of each window arrives with it (False: the sampler has not come round)."""
        for _ in range(windows):
            self.control.at_step_boundary()
            size = self.control.size
            step_time = self.step_time(size)
            for _ in range(steps):
                self.step += 1
                if self.scheduler_every and self.step % self.scheduler_every == 0:
                    self.optimizer.step()  # no gradients: a no-op the scheduler expects first
                    self.scheduler.step()
            sample = self.sample(size) if sampled else self.stale_sample
            self.control.observe_sample(sample, self.step)
            self.extension.on_tick(sample)
            self.t += step_time * steps
            self.samples += size * steps
            metrics = Metrics(
                t=self.t,
                step=self.step,
                batch_size=size,
                step_time_s=step_time,
                samples_per_s=size / step_time,
                b_simple=None,
                steps_in_window=steps,
                samples=self.samples,
                scalars={"loss": loss(self.step)},
                noise=self.noise(self.step),
            )
            self.events.extend(self.control.observe_metrics(metrics))
            self.extension.metrics_part(metrics)
            self.advice = self.advisor_extension.metrics_part(metrics)["advice"]
            self.sizes.append(size)
        return self

    def sample(self, size: int) -> DeviceSample:
        """The sampler's reading of the process after steps at ``size``: taken after the
        switch (a microsecond after it at least, as a real sampler's comes well after)."""
        host = HostReading(rss_bytes=(100 << 20) + size * 1024)
        t = max(time.time(), self.switched_at) + 1e-6
        return DeviceSample(devices=[], gpu=Capability(False, "no GPU"), host=host, t=t)

    def decisions(self, kind: str | None = None) -> list:
        return [d for d in self.autopilot.decisions if kind is None or d.kind == kind]
