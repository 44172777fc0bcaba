"""``attach()`` and the ``Monitor``: the handle a training job holds (DESIGN.md's public
calls, and ``close``). ``assemble`` builds its parts; the training thread's own part is
``runtime.hot_path``, whose scheduled slow path is ``boundary``."""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from ..batch.loader import MonitoredDataLoader, batch_length, make_dataloader
from ..batch.oom import is_out_of_memory
from ..runtime import interrupts, signals
from ..runtime.inbox import Flush
from ..summary import build as summary_build
from ..wire import discovery, protocol
from ..wire.protocol import Event, ProbeResult
from .assemble import assemble
from .job import Job
from .options import checked_options

_live_monitors: weakref.WeakSet[Monitor] = weakref.WeakSet()


class Monitor:
    """The handle ``attach()`` returns. See DESIGN.md for the public contract; ``job`` is
    what bsmon's own integrations reach beneath it (``agent.job.Job``)."""

    job: Job

    def __init__(
        self, model: torch.nn.Module | None, optimizer: torch.optim.Optimizer, **options: Any
    ) -> None:
        checked = checked_options(model, optimizer, options)
        assemble(self, model, optimizer, checked)
        _live_monitors.add(self)
        atexit.register(self._close_at_exit)
        signals.install(live_monitors)
        interrupts.install()  # Ctrl-C's traceback ends at the user's line
        self._inbox.append(
            Event(
                t=time.time(),
                step=0,
                kind="attached",
                message=f"bsmon attached to {self.job.name} (pid {self._pid})",
            )
        )
        if checked.autopilot and self.job.autopilot is not None:
            self.job.autopilot.start()

    # -- public API ---------------------------------------------------------------------------

    @property
    def batch_size(self) -> int | None:
        """The current batch size (in accumulation mode: the effective batch per step)."""
        return self.job.batch_control.size if self.job.batch_control is not None else None

    def _pass_examples(self) -> int | None:
        """One backward pass's examples when the job says them itself: the batch it drew from
        a DataLoader, or its declared micro-batch under accumulation; else None (count them)."""
        if self._samples.passes_known:
            return self._samples.last_batch
        if self.accumulation_steps > 1:
            return self.micro_batch_size
        return None

    @property
    def micro_batch_size(self) -> int | None:
        control = self.job.batch_control
        return control.loader_size if control is not None else None

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per optimizer step (1 unless attach(micro_batch_size=...))."""
        return (
            self.job.batch_control.accumulation_steps if self.job.batch_control is not None else 1
        )

    @property
    def step(self) -> int:
        return self._progress.step

    @property
    def noise_scale(self) -> float | None:
        return self._noise.reading.b_simple

    def should_step(self) -> bool:
        """Accumulation mode: call once per micro-batch, after backward; True when the loop
        should call ``optimizer.step()`` (every ``accumulation_steps`` micro-batches)."""
        hot = self._hot
        hot.micro_batches += 1
        self._progress.quiet = False  # the step's end resets the count: not an ordinary one
        return hot.micro_batches >= self.accumulation_steps

    def log(self, **scalars: Any) -> None:
        """Show and record scalars (floats, ints or one-element tensors); never syncs a GPU.

        Part of the hot path (``runtime.hot_path``): one append; on a loop logging over ~640
        times a second, ``mon.log`` *is* a ``dict.update`` keeping each name's latest value
        (``runtime.logged``: the call goes straight to C, no frame of bsmon's). The agent
        thread reads the values soon after, and reports one it cannot show as a number. A
        tensor is read then, not now: log a fresh one (the loss, ``acc / n``), not one the
        loop changes in place afterwards (``acc.zero_()``: log ``acc.clone()``)."""
        self._log_into(scalars)

    def _keep_latest_logged(self, latest_only: bool) -> None:
        inbox = self._inbox
        self._log_into = inbox.latest.update if latest_only else inbox.logged.append
        if latest_only:  # the instance's attribute shadows the method: see log()
            vars(self)["log"] = inbox.latest.update
        else:
            vars(self).pop("log", None)
        self._hot.keep_latest_loss(latest_only)

    def dataloader(self, dataset: Any, **kwargs: Any) -> MonitoredDataLoader:
        """A DataLoader whose batch size follows ``mon.batch_size`` for every batch."""
        control = self.job.batch_control
        if control is None:
            raise ValueError("mon.dataloader() needs attach(..., batch_size=N)")
        sampler = kwargs.get("sampler")
        if isinstance(sampler, torch.utils.data.DistributedSampler) and hasattr(dataset, "__len__"):
            samples, world = len(dataset), sampler.num_replicas
            if samples % world:
                how = "drops" if sampler.drop_last else "pads with repeated"
                self._ctx.warn_once(
                    "uneven_world_split",
                    f"{samples} samples do not split evenly over {world} ranks: "
                    f"DistributedSampler {how} samples every epoch",
                )
        return make_dataloader(
            dataset, lambda: control.loader_size, self._accounting.on_batch, **kwargs
        )

    def on_batch_size_change(self, callback: Callable[[int, int], None]) -> None:
        """Call ``callback(old, new)`` on the training thread whenever the batch size changes."""
        if self.job.batch_control is None:
            raise ValueError("on_batch_size_change() needs attach(..., batch_size=N)")
        self.job.batch_control.add_callback(callback)

    def request_batch_size(self, value: int, confirm: bool = False) -> protocol.Reply:
        """Ask for a new batch size through the same path and checks as the monitor's command."""
        fields = {"type": "set_batch_size", "id": "api", "value": value, "confirm": confirm}
        return self.job.router.handle_fields({**fields, "reason": "requested by the job"})

    def probe(self, memory_budget: int | None = None, timeout: float = 600.0) -> ProbeResult:
        """Run the max-batch-size probe in a sidecar process and wait for its result.

        The job's state is not touched, but this call blocks the calling thread until the
        probe ends (the dashboard's ``p`` runs it without blocking the job). On the CPU,
        ``memory_budget`` (bytes) plays the device's memory.
        """
        reply = self.job.router.handle(
            protocol.encode(
                protocol.ProbeCommand(id="api", memory_budget=memory_budget, timeout_s=timeout)
            )
        )
        if not reply.ok:
            return ProbeResult(status="refused", error=reply.error)
        result = self.job.prober.wait(timeout + 60)
        return result or ProbeResult(status="timeout", error="the probe did not finish")

    def set_probe_batch(self, batch: Any) -> None:
        """Give the probe a batch to grow (for loops that do not use mon.dataloader)."""
        n = batch_length(batch)
        if n is None:
            raise ValueError("set_probe_batch() needs a tensor, or a tuple/list/dict of tensors")
        self.job.probe_source.offer(batch, n)

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Wrap forward and backward: an out-of-memory error is caught, memory freed, the
        batch size returned to the last size that ran, and the samples of the step re-queued
        in ``mon.dataloader`` so none is lost. Other errors pass through."""
        try:
            yield
        except Exception as exc:
            oom = self._oom
            if oom is None or not is_out_of_memory(exc) or not oom.recover(exc, self.job.optimizer):
                raise

    def stats(self) -> dict[str, Any]:
        """A snapshot of what the monitor shows (aggregates lag the training thread by ≤ a tick)."""
        t, noise = self.job.telemetry, self._noise.reading
        return {
            "name": self.job.name,
            "step": self._progress.step,
            "batch_size": self.batch_size,
            "samples": t.samples,
            "step_time_s": t.step_time_s,
            "samples_per_s": t.samples_per_s,
            "throughput": self._throughput.stats(),  # tokens/s, MFU, or why not
            "b_simple": noise.b_simple,
            "noise": {name: getattr(noise, name) for name in noise.__struct_fields__},
            "anatomy": self._anatomy.latest_dict() if self._anatomy is not None else None,
            "ranks": self._ranks.latest_dict() if self._ranks is not None else None,  # rank 0's
            "scalars": dict(t.scalars),
            "errors": self._guard.count,
            "socket": str(self.socket_path) if self.socket_path else None,
            "record": self.session.record,
            "serving": self.job.serving.available,
            "advice": self._advice(),
        }

    def _advice(self) -> dict[str, Any] | None:
        """The advisor's latest answer (None: no batch size declared, not rank 0, or no
        metrics window yet)."""
        advisor = self.job.advisor
        latest = advisor.latest if advisor is not None else None
        if latest is None:
            return None
        return {name: getattr(latest, name) for name in latest.__struct_fields__}

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until the agent thread has processed (and broadcast) everything so far."""
        if not self._service.is_alive():
            return False
        done = threading.Event()
        self._inbox.append(Flush(done))
        self._service.wake()
        return done.wait(timeout)

    def record_probe_result(self, result: dict[str, Any]) -> None:
        """Put a probe's result in the session record (any thread; never raises)."""
        if self.job.recorder is not None:
            self.job.recorder.probe(result, self._progress.step)

    def _close_at_exit(self) -> None:
        """``close`` at exit, whatever lands meanwhile: a second Ctrl-C is held back until it
        is done (``interrupts.signals_deferred``); one that gets in before, or an error, ends
        the record saying its close was cut short, and is never printed over the job's end."""
        reason = interrupts.EXITED
        try:
            reason = interrupts.exit_reason()
            with interrupts.signals_deferred():
                self.close(reason)
        except BaseException as exc:
            with contextlib.suppress(BaseException), interrupts.signals_deferred():
                if self.job.recorder is not None:
                    cut = f"{reason}; bsmon's close was cut short ({type(exc).__name__})"
                    if self.job.recorder.close(cut, self._progress.step):
                        self._write_summary(self.job.recorder.path)

    def close(self, reason: str = "closed") -> None:
        """Remove every hook, stop every thread, remove the socket, end the record and write
        its summary beside it. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._hot.remove()
        # the noise scale's hooks, the anatomy's, a probe's sidecar, the ranks' exchange:
        # before the forward watch closes (the noise scale's sources release their hold on it)
        self._service.detach_extensions()
        self._accounting.unsubscribe()
        self.job.probe_source.close()
        self._model_examples.remove()
        self._watch.close()
        atexit.unregister(self._close_at_exit)
        _live_monitors.discard(self)
        if os.getpid() != self._pid:
            return  # a forked child: the threads and the socket belong to the parent
        self._service.last_words()  # an unapplied batch size, the autopilot's end
        self._service.stop(reason)
        self._hot.let_go()  # the last tick's tensors: no step is left to drop them
        if self.socket_path is not None:
            discovery.remove_job_files(self.socket_path)
        if self.job.recorder is not None and self.job.recorder.close(reason, self._progress.step):
            self._write_summary(self.job.recorder.path, said=self.job.recorder.failed is not None)
        signals.uninstall_if_idle()

    @staticmethod
    def _write_summary(record: Path, said: bool = False) -> None:
        """The summary beside the whole record (a failure is a warning: the record stands;
        ``said``: none after a stopped recording, whose failing disk was said already)."""
        try:
            summary_build.write_summary_beside(record)
        except Exception as exc:
            if said:
                return
            warnings.warn(
                f"bsmon: could not write the summary of {record}: {exc}",
                RuntimeWarning,
                stacklevel=1,
            )

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_exc: object) -> None:
        self.close("closed" if kind is None else interrupts.ending(kind))

    def __repr__(self) -> str:
        state = "closed" if getattr(self, "_closed", True) else f"step {self._progress.step}"
        name, path = (
            getattr(getattr(self, "job", None), "name", "?"),
            getattr(self, "socket_path", None),
        )
        return f"<bsmon.Monitor {name!r} {state} socket={path}>"


def attach(
    model: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer,
    **options: Any,
) -> Monitor:
    """Attach bsmon to a training job and serve it on a local socket; returns the Monitor."""
    return Monitor(model, optimizer, **options)


def live_monitors() -> Iterable[Monitor]:
    return list(_live_monitors)
