"""After each batch-size change (agent thread): what it bought in throughput, once resolved
from the noise (``verdict``), what it made of an example (``progress``: the measured
signal), and whether the loss held or diverged, and then recovered (``loss_watch``). A size
whose change held becomes the last size that trained well, the base of the 2× rule; one whose
loss diverged does not, even once it recovered."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

from ..wire.protocol import BatchChange, Event, Metrics
from . import loss_watch, verdict
from .goodput import resolved
from .loss_watch import LossWatch
from .progress import ProgressMeter
from .verdict import SizeThroughput

CHANGE_HISTORY = 50
LOSS = "loss"  # the scalar watched: what the job logs as mon.log(loss=...)


class ChangeWatch:
    def __init__(self, initial: int, step: Callable[[], int]) -> None:
        self.changes: deque[BatchChange] = deque(maxlen=CHANGE_HISTORY)
        self.trained_well = initial
        self.sizes: dict[int, SizeThroughput] = {}
        self._loss = LossWatch()
        self.progress = ProgressMeter()
        self._phi: float | None = None  # B_simple at the latest window (None: unresolved)
        self._step = step
        # the loss is not one objective (bsmon run with a GAN's two optimizers: the values
        # backward() was called on alternate between them): only a NaN or inf is judged
        self.loss_mixed = False
        # whether a probe's sidecar shared the job's device after a time: a window it overlaps
        # measures the job with a neighbour, not a batch size (the agent connects the probe)
        self.device_shared_since: Callable[[float], bool] = lambda _t: False
        self._last_window_end: float | None = None
        self._shared_s = 0.0  # seconds since the latest change that a probe shared

    @property
    def latest(self) -> BatchChange | None:
        return self.changes[-1] if self.changes else None

    def watching_loss_since(self) -> int | None:
        """The step of the change whose loss is being watched (None: none)."""
        latest = self.latest
        return latest.step if latest is not None and self._loss.watching else None

    def add_change(self, change: BatchChange) -> None:
        latest = self.latest
        if latest is not None and latest.verdict is None:
            latest.verdict = verdict.LEFT
        before = self.sizes.get(change.old)
        if before is not None:
            change.samples_per_s_before = before.mean
            change.samples_per_s_se_before = before.se
        self.changes.append(change)
        self._shared_s = 0.0
        self._loss.start(change.step)
        self.progress.change(change.old, change.new, change.step, self._phi)

    def observe(self, metrics: Metrics, nonfinite_loss: bool = False) -> list[Event]:
        """Feed one metrics window; returns the events it completes."""
        steps = metrics.steps_in_window
        if not steps:
            return []
        latest = self.latest
        self._add_throughput(metrics, latest)
        events = []
        loss = None if self.loss_mixed else metrics.scalars.get(LOSS)
        outcome = self._loss.observe(steps, loss, nonfinite_loss)
        if outcome is not None and latest is not None:
            events.extend(self._loss_outcome(latest, outcome, metrics.step))
        if (estimate := resolved(metrics.noise)) is not None:
            self._phi = estimate.point
        if self.progress.observe(metrics.step, steps, metrics.samples, loss) and latest:
            events.append(self._measured(latest))
        judged = self._judge(latest, metrics.t) if latest and latest.verdict is None else None
        if judged is not None:
            events.append(judged)
        return events

    def _add_throughput(self, metrics: Metrics, latest: BatchChange | None) -> None:
        size, rate, step_time = metrics.batch_size, metrics.samples_per_s, metrics.step_time_s
        started, self._last_window_end = self._last_window_end, metrics.t
        if size is None or not rate or not step_time:
            return
        if started is None:
            return  # the window's start is unknown
        if self.device_shared_since(started):
            self._count_shared(started, metrics.t, latest)
            return  # a probe slowed the job in it: it measures a neighbour, not a size
        first = metrics.step - metrics.steps_in_window
        if latest is not None and first < latest.step < metrics.step:
            return  # a window with steps at both sizes belongs to neither
        seconds = step_time * metrics.steps_in_window
        self.sizes.setdefault(size, SizeThroughput()).add(rate * seconds, seconds)

    def _count_shared(self, started: float, ended: float, latest: BatchChange | None) -> None:
        """A window a probe shared is not waited for either: the verdict's wait counts the
        seconds after the change that measured the new size."""
        since = started if latest is None else max(started, latest.t)
        self._shared_s += max(ended - since, 0.0)

    def _judge(self, change: BatchChange, now: float) -> Event | None:
        before, after = self.sizes.get(change.old), self.sizes.get(change.new)
        if before is None or after is None:
            return None
        found = verdict.judge(before, after, now - change.t - self._shared_s)
        if found is None:
            return None
        change.verdict = found.outcome
        change.samples_per_s_before, change.samples_per_s_after = found.before, found.after
        change.samples_per_s_se_before, change.samples_per_s_se_after = (
            found.se_before,
            found.se_after,
        )
        return Event(
            t=time.time(),
            step=self._step(),
            kind="batch_size_result",
            message=found.text(change.old, change.new),
            data={
                "old": change.old,
                "new": change.new,
                "change_step": change.step,
                "verdict": found.outcome,
                "before": found.before,
                "after": found.after,
                "se_before": found.se_before,
                "se_after": found.se_after,
            },
        )

    def _measured(self, change: BatchChange) -> Event:
        """The change's progress per example, once its measurement is final."""
        found = self.progress.latest
        assert found is not None
        change.efficiency = found.efficiency
        change.efficiency_low, change.efficiency_high = found.low, found.high
        return Event(
            t=time.time(),
            step=self._step(),
            kind="batch_size_progress",
            message=found.text(),
            data={
                "old": change.old,
                "new": change.new,
                "change_step": change.step,
                "efficiency": found.efficiency,
                "low": found.low,
                "high": found.high,
                "predicted": found.predicted,
                "examples_before": found.examples_before,
                "examples_after": found.examples_after,
            },
        )

    def _loss_outcome(
        self, change: BatchChange, outcome: loss_watch.Outcome, step: int
    ) -> list[Event]:
        change.loss = outcome.status
        if outcome.status == loss_watch.RECOVERED:
            return [self._recovered(change, outcome, step)]
        if outcome.status != loss_watch.DIVERGED:
            self.trained_well = change.new
            return []
        before, after = outcome.before, outcome.after
        level = f"{before:.3g} → {after:.3g}" if before is not None else f"now {after}"
        if after is None or not math.isfinite(after):
            what, after = "the loss became NaN or infinite", None
        else:
            what = f"loss rose {level}, well above its level before the change"
        lr = "".join(f"; {note}" for note in (change.lr_note, change.optimizer_note) if note)
        return [
            Event(
                t=time.time(),
                step=self._step(),
                kind="loss_diverged",
                level="warning",
                message=(
                    f"{what} after batch {change.old} → {change.new} at step {change.step:,}"
                    f"{lr}: the change is the likely cause"
                ),
                data={
                    "change_step": change.step,
                    "old": change.old,
                    "new": change.new,
                    "before": before,
                    "after": after,
                },
            )
        ]

    def _recovered(self, change: BatchChange, outcome: loss_watch.Outcome, step: int) -> Event:
        """The loss came back after its divergence (the window ending at ``step``): said once,
        so that the warning about the change no longer stands."""
        after = outcome.after
        return Event(
            t=time.time(),
            step=step,
            kind="loss_recovered",
            message=(
                f"loss recovered to {after:.3g} at step {step:,} (it rose after batch "
                f"{change.old} → {change.new} at step {change.step:,})"
            ),
            data={
                "change_step": change.step,
                "old": change.old,
                "new": change.new,
                "step": step,
                "after": after,
            },
        )
