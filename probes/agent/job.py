"""``Monitor.job``: a job's monitor as bsmon's own code reaches it.

The user's API is ``Monitor`` (DESIGN.md). What the integrations (``integrations/``), ``bsmon
run`` (``launch/``), its resizable loader (``batch/script_loader``) and bsmon's tests need of
the parts beneath it is here, typed and named: the parts ``assemble`` made, and the joins
they make through methods rather than by writing another part's fields. Names here may
change with bsmon; a user's script keeps to ``Monitor``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..batch.advisor import Advisor
from ..batch.autopilot import Autopilot
from ..batch.control import BatchController
from ..maxbatch.job import ProbeSource
from ..maxbatch.runner import ProbeRunner
from ..noise import NoiseScale
from ..record.recorder import Recorder
from ..runtime.context import JobContext
from ..runtime.hot_path import HotPath
from ..runtime.inbox import Inbox
from ..runtime.samples import StepSamples
from ..runtime.telemetry import Telemetry
from ..wire import protocol
from ..wire.protocol import Capability, Event
from ..wire.routing import CommandRouter
from .accounting import Accounting
from .boundary import Boundary


class Job:
    """The assembled parts of one monitor, and the joins bsmon's own code makes to them."""

    # the job as attach() was given it (optimizer: the one followed, see follow_optimizer)
    name: str
    model: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    loss_fn: Any
    noise_window: int
    record: bool | str | Path
    serving: Capability  # whether the socket is served, and why not
    # the parts
    ctx: JobContext
    telemetry: Telemetry
    router: CommandRouter
    batch_control: BatchController | None  # None: no batch size declared
    probe_source: ProbeSource
    prober: ProbeRunner
    recorder: Recorder | None
    autopilot: Autopilot | None  # None: no batch control, or not rank 0
    noise: NoiseScale
    inbox: Inbox
    samples: StepSamples
    hot: HotPath
    accounting: Accounting
    boundary: Boundary

    # -- from the integrations and bsmon run (training thread unless said) -------------------

    def count_samples(self, samples: int, batch_size: int | None = None) -> None:
        """Count ``samples`` toward the step in progress, for batches from loaders bsmon did not
        make (``bsmon run``, the framework integrations). Without batch control, the first
        ``batch_size`` of a step (default: ``samples``) is reported as the job's batch size."""
        self.samples.count(samples, batch_size)

    def emit(self, event: Event) -> None:
        """Add ``event`` to the job's events (shown by the monitor); O(1), any thread."""
        self.ctx.emit(event)

    def report_error(self, where: str, exc: BaseException) -> None:
        """Count and show an exception caught in bsmon code outside the Monitor (an
        integration's hook); the job never sees it."""
        self.ctx.guard.report(where, exc)

    def disable(self, kind: str, reason: str) -> None:
        """Make the ``kind`` command answer ``ok: false`` with ``reason`` (also in hello)."""
        self.router.disable(kind, reason)

    def defer_batch_changes(self, where: str) -> None:
        """Batch-size changes are applied ``where`` (the integration then calls
        ``batch_control.apply_deferred()`` there), not at the next step boundary."""
        if self.batch_control is not None:
            self.batch_control.defer_to(where)

    def veto_batch_sizes(self, refusal: Callable[[int], str | None]) -> None:
        """``refusal(size)``: why the job's own loader cannot take ``size`` (None: it can)."""
        if self.batch_control is not None:
            self.batch_control.veto = refusal

    def why_no_probe(self, reason: str | None) -> None:
        """Why the probe cannot run yet (None: it can)."""
        self.probe_source.why_not = reason

    def loss_given(self, loss: Any) -> None:
        """A framework's ``backward(loss)`` was called (``bsmon run``, accelerate): show
        ``loss`` as the loss, not the scalar that framework then calls ``backward()`` on (one
        append)."""
        self.inbox.losses.append((loss,))  # a tuple: given, not seen at backward()

    def record_backward_loss(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``Tensor.backward`` that also shows the tensor as the loss (``bsmon run``): one
        append on the training thread; the agent thread keeps it if it is a scalar."""
        return self.hot.loss_at_backward(original)

    def watch_every_optimizer(self, on_other: Callable[[Any, float], None]) -> None:
        """``on_other(optimizer, end)`` at the end of each step of an optimizer other than the
        one followed (``bsmon run``); the followed one's steps cost the same."""
        self.hot.every_optimizer(on_other)

    def follow_optimizer(self, optimizer: torch.optim.Optimizer, earlier: list[float]) -> None:
        """In a post-hook of ``optimizer``'s step (from ``on_other``): count its steps from
        this one on, and the steps it took before, ending at ``earlier``, first; the followed
        optimizer stopped stepping (one optimizer per layer or stage, trained one after the
        other). The noise scale measured the parameters of the one before: it stops."""
        old = type(self.optimizer).__name__
        self.hot.follow(optimizer, earlier)
        self.optimizer = optimizer
        if self.batch_control is not None:
            self.batch_control.add_optimizer(optimizer)
        self.noise.refuse(
            f"it measured the gradients of the parameters {old} trains, and {old} stopped "
            f"stepping at step {self.ctx.progress.step - len(earlier)}"
        )

    def at_scheduled_boundaries(self, listener: Callable[[bool], None]) -> None:
        """``listener(sampled)`` at each step boundary the hot path schedules (at least at
        every step before and after a sampled one): ``sampled`` says whether the next step is
        one the step anatomy samples."""
        self.boundary.listeners.append(listener)

    def training_iterator(self) -> Any:
        """The DataLoader iterator the job's training batches come from now (None: none)."""
        return self.accounting.training_iterator()

    def on_training_iterator(self, callback: Callable[[Any], None] | None) -> None:
        """``callback(iterator)`` once per training DataLoader iterator (an epoch)."""
        self.accounting.on_new_training_iterator = callback

    @property
    def training_epochs(self) -> int:
        """Training DataLoader iterators begun."""
        return self.accounting.training_epochs

    # -- the autopilot, through the same path as the monitor's keys ---------------------------

    def set_autopilot(self, on: bool) -> protocol.Reply:
        """Switch the autopilot on or off through the same path as the monitor's ``a`` key."""
        return self.router.handle_fields({"type": "autopilot", "id": "api", "on": on})

    @property
    def advisor(self) -> Advisor | None:
        """The one answer to which batch size (None: as for the autopilot, whose it is)."""
        return self.autopilot.advisor if self.autopilot is not None else None

    def autopilot_reading(self) -> protocol.AutopilotReading | None:
        """What the autopilot sees and did (None: this job has none: no batch size declared,
        or not rank 0)."""
        return self.autopilot.reading() if self.autopilot is not None else None
