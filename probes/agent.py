"""``attach()`` and the ``Monitor``: the part of bsmon that lives inside the training job.

The training thread does O(1) work per step: a few attribute updates and one
``deque.append`` of a small tuple. Aggregation, device sampling and the socket all live on
the agent's daemon threads (``service.AgentService``).
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from . import discovery, protocol, sigterm
from .commands import CommandRouter
from .data import MonitoredDataLoader, batch_length, make_dataloader
from .devices import DeviceSampler
from .hooks import StepHooks
from .protocol import Capability, Event, SessionInfo
from .record import Recorder, claim_record_path, default_record_path
from .safety import FaultGuard
from .service import AgentService, PeriodicSampler
from .telemetry import EVENT, FLUSH, LOG, STEP, Telemetry
from .timing import ScalarError, StepClock, capture_scalar

INBOX_CAPACITY = 1 << 16
NOISE_SCALE_CHOICES = ("auto",)
_live_monitors: weakref.WeakSet[Monitor] = weakref.WeakSet()


def _bsmon_version() -> str:
    from . import __version__

    return __version__


def _distributed_rank() -> tuple[int, int]:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _default_name() -> str:
    script = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else ""
    return script if script and script not in ("-c", "-m", "") else "python"


def _check_positive_int(name: str, value: object, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


class Monitor:
    """The handle ``attach()`` returns. See DESIGN.md for the public contract."""

    def __init__(
        self,
        model: torch.nn.Module | None,
        optimizer: torch.optim.Optimizer,
        *,
        batch_size: int | None = None,
        name: str | None = None,
        loss_fn: Any = None,
        noise_scale: str | None = "auto",
        noise_window: int = 1000,
        socket_dir: str | os.PathLike[str] | None = None,
        record: bool | str | os.PathLike[str] = True,
        sample_interval_s: float = 1.0,
        serve: bool = True,
    ) -> None:
        _check_positive_int("batch_size", batch_size)
        _check_positive_int("noise_window", noise_window, allow_none=False)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"bsmon needs a torch.optim.Optimizer, got {type(optimizer).__name__}; "
                "an optimizer must subclass torch.optim.Optimizer and call its __init__"
            )
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if noise_scale is not None and noise_scale not in NOISE_SCALE_CHOICES:
            choices = ", ".join(repr(c) for c in (*NOISE_SCALE_CHOICES, None))
            raise ValueError(f"noise_scale must be one of {choices}, got {noise_scale!r}")
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        if not sample_interval_s > 0:
            raise ValueError(f"sample_interval_s must be positive, got {sample_interval_s!r}")

        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.name = name or _default_name()
        self.noise_window = noise_window
        self.record = record
        self._batch_size = batch_size
        self._pid = os.getpid()
        self._closed = False
        self._close_lock = threading.RLock()  # re-entered by the SIGTERM handler

        # training-thread state
        self._step = 0
        self._batch_samples = 0
        self._inbox: deque = deque(maxlen=INBOX_CAPACITY)
        self._guard = FaultGuard(self._emit_event, lambda: self._step)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        self._clock = StepClock.for_parameters(params)

        rank, world_size = _distributed_rank()
        self.session = SessionInfo(
            name=self.name,
            pid=self._pid,
            host=socket.gethostname(),
            argv=list(sys.argv),
            start_time=time.time(),
            python=sys.version.split()[0],
            torch_version=str(torch.__version__),
            bsmon_version=_bsmon_version(),
            cwd=os.getcwd(),
            rank=rank,
            world_size=world_size,
        )
        self.telemetry = Telemetry()
        self.telemetry.batch_size = batch_size
        self.recorder = self._make_recorder(record, socket_dir)
        self.router = CommandRouter()
        self._hooks = StepHooks(optimizer, self._on_step_begin, self._on_step_end, self._guard)
        self.socket_path: Path | None = None
        self.serving = Capability(False, "serve=False")
        if serve:
            self.socket_path = self._prepare_socket(socket_dir)
        self._service = AgentService(
            inbox=self._inbox,
            telemetry=self.telemetry,
            router=self.router,
            sampler=PeriodicSampler(DeviceSampler(), sample_interval_s),
            session=self.session,
            socket_path=self.socket_path,
            fault_count=lambda: self._guard.count,
            noise_capability=lambda: Capability(False, "not enabled"),
            recorder=self.recorder,
        )
        if self.recorder is not None:
            self.recorder.start()
        self._start_service()
        _live_monitors.add(self)
        atexit.register(self._close_at_exit)
        sigterm.install(live_monitors)
        self._emit_event(
            Event(
                t=time.time(),
                step=0,
                kind="attached",
                message=f"bsmon attached to {self.name} (pid {self._pid})",
            )
        )

    # -- setup --------------------------------------------------------------------------------

    def _prepare_socket(self, socket_dir: str | os.PathLike[str] | None) -> Path | None:
        try:
            directory = discovery.ensure_private_dir(
                Path(socket_dir).expanduser() if socket_dir is not None else discovery.default_dir()
            )
            path = discovery.free_socket_path(directory, self._pid)
        except (discovery.BsmonDirError, OSError) as exc:
            self._degrade(str(exc))
            return None
        return path

    def _make_recorder(
        self, record: bool | str | os.PathLike[str], socket_dir: str | os.PathLike[str] | None
    ) -> Recorder | None:
        """The session recorder (``record=True``: in BSMON_DIR/records; a path: there)."""
        if record is False:
            return None
        private_dir = None
        if record is True:
            base = (
                Path(socket_dir).expanduser() if socket_dir is not None else discovery.default_dir()
            )
            path = default_record_path(base, self.name, self.session.start_time, self._pid)
            private_dir = path.parent
        elif isinstance(record, (str, os.PathLike)) and os.fspath(record):
            path = Path(record).expanduser().absolute()
        else:
            raise TypeError(f"record must be True, False or a path, got {record!r}")
        path = claim_record_path(path)
        self.session.record = str(path)
        return Recorder(
            path, self.session, self.telemetry, self._emit_event, private_dir=private_dir
        )

    def _start_service(self) -> None:
        try:
            self._service.start_and_wait()
        except Exception as exc:
            self._degrade(f"could not serve {self.socket_path}: {exc}")
            self.socket_path = None
            return
        if self.socket_path is not None:
            self.serving = Capability(True)
            discovery.write_metadata(
                self.socket_path,
                {
                    "name": self.name,
                    "pid": self._pid,
                    "host": self.session.host,
                    "start_time": self.session.start_time,
                },
            )

    def _degrade(self, reason: str) -> None:
        self.serving = Capability(False, reason)
        warnings.warn(
            f"bsmon: not serving a socket, the job goes on unmonitored: {reason}",
            RuntimeWarning,
            stacklevel=4,
        )

    # -- training-thread hot path ------------------------------------------------------------

    def _on_step_begin(self) -> None:
        pass

    def _on_step_end(self) -> None:
        self._step += 1
        samples = self._batch_samples or self._batch_size or 0
        self._batch_samples = 0
        self._inbox.append(
            (
                STEP,
                self._step,
                time.time(),
                self._clock.mark(time.perf_counter()),
                samples,
                self._batch_size,
            )
        )

    def _on_batch(self, batch: Any) -> None:
        try:
            n = batch_length(batch)
            self._batch_samples += n if n is not None else (self._batch_size or 0)
        except Exception as exc:
            self._guard.report("dataloader batch accounting", exc)

    def _emit_event(self, event: Event) -> None:
        self._inbox.append((EVENT, event))

    # -- public API ---------------------------------------------------------------------------

    @property
    def batch_size(self) -> int | None:
        return self._batch_size

    @property
    def step(self) -> int:
        return self._step

    @property
    def noise_scale(self) -> float | None:
        return self.telemetry.noise.b_simple

    def log(self, **scalars: Any) -> None:
        """Show and record scalars (floats, ints or one-element tensors); never syncs a GPU."""
        try:
            values = {}
            for key, value in scalars.items():
                try:
                    values[key] = capture_scalar(key, value)
                except ScalarError as exc:
                    self._guard.report(f"log({key}=...)", exc)
            if values:
                self._inbox.append((LOG, self._step, values))
        except Exception as exc:
            self._guard.report("log()", exc)

    def dataloader(self, dataset: Any, **kwargs: Any) -> MonitoredDataLoader:
        """A DataLoader whose batch size follows ``mon.batch_size`` for every batch."""
        if self._batch_size is None:
            raise ValueError("mon.dataloader() needs attach(..., batch_size=N)")
        return make_dataloader(dataset, lambda: self._batch_size or 1, self._on_batch, **kwargs)

    def request_batch_size(self, value: int) -> protocol.Reply:
        """Ask for a new batch size through the same path and checks as the monitor's command."""
        return self.router.handle(protocol.encode(protocol.SetBatchSize(id="api", value=value)))

    def probe(self, **_kwargs: Any) -> protocol.Reply:
        return self.router.handle(protocol.encode(protocol.ProbeCommand(id="api")))

    def stats(self) -> dict[str, Any]:
        """A snapshot of what the monitor shows (aggregates lag the training thread by ≤0.1 s)."""
        t = self.telemetry
        return {
            "name": self.name,
            "step": self._step,
            "batch_size": self._batch_size,
            "samples": t.samples,
            "step_time_s": t.step_time_s,
            "samples_per_s": t.samples_per_s,
            "b_simple": t.noise.b_simple,
            "scalars": dict(t.scalars),
            "errors": self._guard.count,
            "socket": str(self.socket_path) if self.socket_path else None,
            "record": self.session.record,
            "serving": self.serving.available,
        }

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until the agent thread has processed (and broadcast) everything so far."""
        if not self._service.is_alive():
            return False
        done = threading.Event()
        self._inbox.append((FLUSH, done))
        return done.wait(timeout)

    def record_probe_result(self, result: dict[str, Any]) -> None:
        """Put a probe's result in the session record (any thread; never raises)."""
        if self.recorder is not None:
            self.recorder.probe(result, self._step)

    def _close_at_exit(self) -> None:
        self.close("the job exited")

    def close(self, reason: str = "closed") -> None:
        """Remove every hook, stop every thread, remove the socket, end the record and write
        its summary beside it. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._hooks.remove()
        atexit.unregister(self._close_at_exit)
        _live_monitors.discard(self)
        if os.getpid() != self._pid:
            return  # a forked child: the threads and the socket belong to the parent
        self._service.stop(reason)
        if self.socket_path is not None:
            discovery.remove_job_files(self.socket_path)
        if self.recorder is not None:
            self.recorder.close(reason, self._step)
        sigterm.uninstall_if_idle()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if getattr(self, "_closed", True) else f"step {self._step}"
        name, path = getattr(self, "name", "?"), getattr(self, "socket_path", None)
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
