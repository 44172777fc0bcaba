"""``attach()`` and the ``Monitor``: the part of bsmon that lives inside the training job.

The training thread's part is ``runtime.hot_path``: per ordinary step one ``perf_counter``
and one ``deque.append`` of a tuple in the optimizer's post-hook, and one ``deque.append`` per
``mon.log``. Work that needs the training thread at some steps (a batch-size change, the noise
scale's measured steps, the anatomy's sampled steps, DDP timing) is scheduled: the hot path
calls ``Monitor._at_boundary`` at the steps it asked for. Aggregation, device sampling and the
socket all live on the agent's daemon threads (``runtime.service.AgentService``).

Why one module: ``Monitor`` is the composition root (it builds every wing's part and wires
them together) and the public API of DESIGN.md; its training-thread methods are the targets
of the DataLoader's hooks and of the hot path's scheduled boundaries. Everything else lives in the
wings: option checks (``options``), identity (``runtime.session``), the inbox records, the
recorder, the extensions.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import socket
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from .anatomy.extension import AnatomyExtension
from .anatomy.marks import PhaseMarks
from .anatomy.sampling import STRIDE_VARIABLE, AnatomySampler, stride_from_environment
from .anatomy.verdict import LoaderFacts, loader_facts
from .batch.autopilot import Autopilot
from .batch.control import BatchController, Pending
from .batch.extension import AutopilotExtension, BatchExtension, register_autopilot
from .batch.extension import register_commands as register_batch_commands
from .batch.loader import DynamicBatchSampler, MonitoredDataLoader, batch_length, make_dataloader
from .batch.lr_scaling import DEFAULT as DEFAULT_LR_SCALING
from .batch.oom import is_out_of_memory, release_memory
from .batch.policy import BatchPolicy, StepRule
from .maxbatch.job import ProbeSource, device_free
from .maxbatch.runner import ProbeExtension, ProbeRunner
from .noise import DEFAULT_BUDGET as NOISE_BUDGET
from .noise import NoiseExtension, NoiseScale
from .noise.autograd import ExampleCounter
from .noise.shared_backward import SharedBackward
from .options import check_options
from .record.recorder import Recorder
from .record.writer import RECORDS_SUBDIR, claim_record_path, default_record_path
from .runtime import audience, distributed, interrupts, loader_watch, mode_watch, signals
from .runtime.devices import DeviceSampler
from .runtime.evaluation import EvalClock
from .runtime.fault_guard import FaultGuard
from .runtime.forward_watch import ForwardWatch, RootPass
from .runtime.hot_path import NEVER, HotPath, StepWork
from .runtime.inbox import Flush, Inbox
from .runtime.progress import Progress
from .runtime.ranks import (
    DDP_SAMPLE_EVERY,
    DdpTiming,
    RankExchange,
    RanksExtension,
    rank_summary,
    store_for,
)
from .runtime.samples import CHECK_EVERY, StepSamples
from .runtime.service import AgentService, Extension, PeriodicSampler
from .runtime.session import default_name, session_info
from .runtime.telemetry import Telemetry
from .runtime.timing import StepClock
from .summary import build as summary_build
from .wire import discovery, protocol
from .wire.protocol import Capability, Event, ProbeResult
from .wire.routing import CommandRouter

REEVALUATES = (
    "LBFGS evaluates its closure several times per step, each at other parameters, so a "
    "step's gradient noise is not defined"
)
SMALL_DEVICE_BATCH = 8  # a per-device batch below this mostly leaves the device waiting
_live_monitors: weakref.WeakSet[Monitor] = weakref.WeakSet()
_ranks_serials = itertools.count()  # every rank attaches in the same order: same namespaces


def _say_recording_stopped(message: str) -> None:
    """One line where a headless user looks, beside the event on the socket: a RuntimeWarning,
    as bsmon says it serves no socket. Under ``bsmon run`` the job's output stays the job's:
    ``bsmon run`` says it after the job, from the process's note (``launch.notes``)."""
    if audience.zero_code():
        return
    with contextlib.suppress(Exception):  # under -W error it would raise in the writer's thread
        # explicit: no stack (another thread's) to point at, so the line stands alone
        warnings.warn_explicit(f"{message}; the job goes on unrecorded", RuntimeWarning, "bsmon", 0)


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
        noise_preconditioned: bool = False,
        noise_budget: float | None = NOISE_BUDGET,
        grad_scaler: Any = None,
        socket_dir: str | os.PathLike[str] | None = None,
        record: bool | str | os.PathLike[str] = True,
        sample_interval_s: float = 1.0,
        serve: bool = True,
        max_batch_size: int | None = None,
        min_batch_size: int = 1,
        batch_step: StepRule = "double",
        micro_batch_size: int | None = None,
        lr_scaling: str | None = DEFAULT_LR_SCALING,
        lr_scheduler: Any = None,
        probe_step: Callable[[torch.nn.Module, Any], torch.Tensor] | None = None,
        ranks_view: bool = True,
        batch_dim: int | None = None,
        step_anatomy: bool = True,
        autopilot: bool = False,
        autopilot_half_batch: float | None = None,
    ) -> None:
        check_options(
            model,
            optimizer,
            batch_size=batch_size,
            batch_dim=batch_dim,
            name=name,
            noise_scale=noise_scale,
            noise_window=noise_window,
            sample_interval_s=sample_interval_s,
            micro_batch_size=micro_batch_size,
            lr_scaling=lr_scaling,
            autopilot=autopilot,
            autopilot_half_batch=autopilot_half_batch,
        )
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.name = name or default_name()
        self.noise_window = noise_window
        self.record = record
        self._pid = os.getpid()
        self._closed = False
        self._close_lock = threading.RLock()  # re-entered by the SIGTERM handler

        # training-thread state
        self._progress = Progress()
        self._samples = StepSamples(self._progress)
        self._inbox = Inbox()
        self._log_into = self._inbox.logged.append  # or latest.update: runtime.logged
        self._guard = FaultGuard(self._emit_event, self._progress)
        self._warned: set[str] = set()
        self._has_batchnorm = model is not None and any(
            isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()
        )
        params = [p for group in optimizer.param_groups for p in group["params"]]
        self._clock = StepClock.for_parameters(params)
        self._phases = PhaseMarks(self._clock) if step_anatomy else None
        stride, stride_error = stride_from_environment()
        self._anatomy_sampler = AnatomySampler(
            stride, follows_rate=not os.environ.get(STRIDE_VARIABLE) or stride_error is not None
        )
        self._loader_facts: tuple[int, LoaderFacts] | None = None  # (iterator id, facts)
        self._loader_sizes: tuple[Callable[[], Any], bool, int | None] = (lambda: None, False, None)
        # called once per training DataLoader iterator (an epoch), on the training thread
        self.on_new_training_iterator: Callable[[Any], None] | None = None
        self.training_epochs = 0  # training DataLoader iterators begun
        self._watch = ForwardWatch(model, self._guard, batch_dim)
        self._watch.on_root(self._on_root_pass)
        self._model_examples = ExampleCounter(self._watch, "samples")
        ring = self._inbox.ring
        self._evals = EvalClock(
            time.perf_counter(), self._progress, lambda: ring.ends[ring.written & ring.mask]
        )
        self.batch_control = None  # made below, once the session is known
        self._noise = NoiseScale(
            model,
            optimizer,
            mode=noise_scale,
            window=noise_window,
            guard=self._guard,
            emit=self._emit_event,
            step=self._progress,
            grad_scaler=grad_scaler,
            preconditioned=noise_preconditioned,
            budget=noise_budget,
            watch=self._watch,
            examples_hint=lambda: self._samples.so_far or self.batch_size,
            pass_hint=self._pass_examples,
            examples_known=lambda: self._pass_examples() is not None,
            step_time=lambda: self.telemetry.step_time_s,
        )

        self.session = session_info(self.name)
        rank, world_size = self.session.rank, self.session.world_size
        ddp = distributed.ddp_of(model, params) if world_size > 1 else None
        if world_size > 1:  # in the record's header too: the step anatomy's note reads it
            self.session.ddp = ddp is not None
        self.telemetry = Telemetry()
        self.telemetry.batch_size = batch_size
        self.telemetry.noise = self._noise.reading
        self.telemetry.report = self._guard.report
        self.telemetry.samples_reason = self._samples_reason
        if self._noise.source is not None:  # the steps' durations price its budget
            self.telemetry.duration_listeners.append(self._noise.on_durations)
        self.recorder = self._make_recorder(record, socket_dir)
        self.router = CommandRouter()
        self.batch_control = self._make_batch_control(
            batch_size,
            BatchPolicy(batch_step, min_batch_size, max_batch_size, micro_batch_size or 1),
            micro_batch_size=micro_batch_size,
            lr_scaling=lr_scaling,
            lr_scheduler=lr_scheduler,
            rank=rank,
            world_size=world_size,
        )
        self._reevaluates = isinstance(optimizer, torch.optim.LBFGS)
        self._boundary_listeners: list[Callable[[bool], None]] = []
        work = StepWork()
        work.noise_step = self._noise.on_step
        work.on_boundary = self._at_boundary
        if self._phases is not None:
            work.optimizer_starting = self._phases.optimizer_starting
            work.take_marks = self._phases.take
        self._hot = HotPath(
            optimizer,
            self._inbox,
            self._progress,
            self._guard,
            work,
            samples=self._samples,
            examples=self._model_examples,
            evals=self._evals,
            reevaluates=self._reevaluates,
        )
        self._hot.control = self.batch_control
        self.telemetry.hand_back = self._hot.hand_back
        self.telemetry.logged_intake.keep_latest = self._keep_latest_logged
        self._hot.need_pre_hook(self._noise.due(1))
        self._hot.noise_due = self._noise.due(1)
        if self._reevaluates:
            self._noise.refuse(REEVALUATES)
        self._shared = (  # the estimate's only concern: nothing to watch when it is off
            SharedBackward(model, optimizer, self._noise.refuse, self._guard)
            if self._noise.source is not None
            else None
        )
        if model is not None:
            mode_watch.subscribe(self._on_mode_switch)
        if (why := loader_watch.subscribe(self._on_loader)) is not None:
            self._warn("loaders_unseen", f"{why}; evaluation time counts as step time")
        self.socket_path: Path | None = None
        self.serving = Capability(False, "serve=False")
        if serve:
            self.socket_path = self._prepare_socket(socket_dir)
        self.probe_source = ProbeSource(
            model, optimizer, loss_fn, probe_step, self.batch_control, watch=self._watch
        )
        self.prober = self._make_prober(rank)
        if self.batch_control is not None:
            self.batch_control.watch.device_shared_since = self.prober.ran_since
        extensions: list[Extension] = [
            NoiseExtension(self._noise, self.telemetry),
            ProbeExtension(self.prober),
        ]
        # reads nothing unless the job is distributed and its model DistributedDataParallel
        self._ddp_timing = DdpTiming(ddp)
        self.telemetry.comm_sample = self._ddp_timing.comm_wait
        self._ranks_exchange: RankExchange | None = None
        self._anatomy: AnatomyExtension | None = None
        if self._phases is not None:
            self._phases.install()
            if stride_error is not None:
                self._warn("anatomy_stride", stride_error)
            self._anatomy = self._anatomy_extension(world_size)
            extensions.append(self._anatomy)
        if world_size > 1 and ranks_view and (ranks := self._make_ranks(rank, world_size)):
            extensions.append(ranks)
        if self.batch_control is not None:
            extensions.append(BatchExtension(self.batch_control, self.telemetry))
        sampler = PeriodicSampler(DeviceSampler(), sample_interval_s)
        self.autopilot = self._make_autopilot(rank, autopilot_half_batch)
        if self.autopilot is not None:
            extensions.append(
                AutopilotExtension(self.autopilot, self.batch_control, sampler.sample_soon)
            )
        self._service = AgentService(
            inbox=self._inbox,
            telemetry=self.telemetry,
            router=self.router,
            sampler=sampler,
            session=self.session,
            socket_path=self.socket_path,
            fault_count=lambda: self._guard.count,
            noise_capability=lambda: self._noise.capability,
            extensions=[*extensions, *([self.recorder] if self.recorder is not None else [])],
            on_rebound=self._socket_rebound,
            report=self._guard.report,
        )
        if self.recorder is not None:
            self.recorder.start()
        self._start_service()
        _live_monitors.add(self)
        atexit.register(self._close_at_exit)
        signals.install(live_monitors)
        interrupts.install()  # Ctrl-C's traceback ends at the user's line
        self._emit_event(
            Event(
                t=time.time(),
                step=0,
                kind="attached",
                message=f"bsmon attached to {self.name} (pid {self._pid})",
            )
        )
        if autopilot and self.autopilot is not None:
            self.autopilot.start()

    # -- setup --------------------------------------------------------------------------------

    def _make_batch_control(
        self,
        batch_size: int | None,
        policy: BatchPolicy,
        *,
        micro_batch_size: int | None,
        lr_scaling: str | None,
        lr_scheduler: Any,
        rank: int,
        world_size: int,
    ) -> BatchController | None:
        if batch_size is None:
            reason = "the job declared no batch size (attach(..., batch_size=N) enables it)"
            for kind in ("set_batch_size", "step_batch_size"):
                self.router.disable(kind, reason)
            return None
        if (refusal := policy.refusal(batch_size)) is not None:
            raise ValueError(f"batch_size: {refusal}")
        group = distributed.control_group() if world_size > 1 else None
        controller = BatchController(
            initial=batch_size,
            policy=policy,
            micro_batch_size=micro_batch_size,
            optimizer=self.optimizer,
            lr_scaling=lr_scaling,
            scheduler=lr_scheduler,
            emit=self._emit_event,
            record=self._inbox.append,
            guard=self._guard,
            step=self._progress,
            noise_scale=lambda: self.noise_scale,
            sync=distributed.StepSync(group, rank) if group is not None else None,
            rank=rank,
            wake=lambda: self._hot.wake(),  # noqa: PLW0108 (self._hot is made later)
        )
        register_batch_commands(self.router, controller)
        if rank != 0:
            for kind in ("set_batch_size", "step_batch_size"):
                self.router.disable(kind, "send batch-size commands to rank 0's monitor")
        return controller

    def _make_autopilot(self, rank: int, declared_half: float | None) -> Autopilot | None:
        """The autopilot, off until switched on (rank 0 decides for every rank)."""
        control = self.batch_control
        if control is None or rank != 0:
            why = (
                "send autopilot commands to rank 0's monitor"
                if control
                else ("the job declared no batch size (attach(..., batch_size=N) enables it)")
            )
            self.router.disable("autopilot", why)
            return None
        noise = self._noise
        autopilot = Autopilot(
            control,
            noise_refusal=lambda: None if noise.capability.available else noise.capability.reason,
            emit=self._emit_event,
            step=self._progress,
            declared_half=declared_half,
            plain_step_s=lambda: noise.budget.plain_step_s,
            epochs=lambda: self.training_epochs,
        )
        register_autopilot(self.router, autopilot)
        return autopilot

    def _make_ranks(self, rank: int, world_size: int) -> RanksExtension | None:
        """Rank 0's view of every rank, through the job's rendezvous store (no collective)."""
        try:
            store = store_for(next(_ranks_serials))
        except Exception as exc:
            self._warn(
                "ranks_view_unavailable",
                f"no ranks view: the job's store is not reachable ({type(exc).__name__}: {exc})",
            )
            return None
        self._ranks_exchange = RankExchange(store, rank, world_size)
        if self.batch_control is not None and self.batch_control.size < SMALL_DEVICE_BATCH:
            self._warn(
                "small_device_batch",
                f"the per-device batch is {self.batch_control.size}: below "
                f"{SMALL_DEVICE_BATCH} samples a device mostly waits; consider gradient "
                "accumulation (micro_batch_size) or fewer ranks",
            )
        placement = (socket.gethostname(), int(os.environ.get("LOCAL_RANK", "0")))
        return RanksExtension(self._ranks_exchange, placement, rank_summary, self._ddp_timing)

    def _anatomy_extension(self, world_size: int) -> AnatomyExtension:
        device = self._clock.device
        return AnatomyExtension(
            self.telemetry,
            world_size=world_size,
            ddp=self.session.ddp,
            loader=lambda: self._loader_facts[1] if self._loader_facts is not None else None,
            device_index=device.index if device is not None else None,
            step=self._progress,
            sampler=self._anatomy_sampler,
        )

    def _warn(self, kind: str, message: str) -> None:
        """A warning from the literature, once per kind."""
        if kind not in self._warned:
            self._warned.add(kind)
            self._warning(kind, message)

    def _warning(self, kind: str, message: str) -> None:
        event = Event(time.time(), self._progress.step, kind, message, level="warning")
        self._emit_event(event)

    def _make_prober(self, rank: int) -> ProbeRunner:
        source = self.probe_source
        device = next(
            (p.device for g in self.optimizer.param_groups for p in g["params"]),
            torch.device("cpu"),
        )
        runner = ProbeRunner(
            check=source.check,
            prepare=source.recipe,
            directory=self.socket_path.parent if self.socket_path else None,
            emit=self._emit_event,
            on_result=lambda result: self._probe_concluded(source, result),
            step=self._progress,
            device_free=lambda: device_free(device),
        )
        if rank != 0:
            self.router.disable("probe", "send probe commands to rank 0's monitor")
        else:
            self.router.register(
                "probe", lambda command: runner.start(command.memory_budget, command.timeout_s)
            )  # type: ignore[attr-defined]
        return runner

    def _probe_concluded(self, source: ProbeSource, result: ProbeResult) -> None:
        """The probe's result: concluded (recommendation, batch control), then recorded."""
        try:
            source.conclude(result, self.noise_scale)
        finally:
            self.record_probe_result(protocol.to_builtins(result))

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
        """The session recorder (``record=True``: in ``discovery.records_dir()``, or beside
        the socket when ``socket_dir`` is given; a path: there)."""
        if record is False:
            return None
        private_dir = None
        if record is True:
            records = (
                Path(socket_dir).expanduser() / RECORDS_SUBDIR
                if socket_dir is not None
                else discovery.records_dir()
            )
            path = default_record_path(records, self.name, self.session.start_time, self._pid)
            private_dir = path.parent
        elif isinstance(record, (str, os.PathLike)) and os.fspath(record):
            path = Path(record).expanduser().absolute()
        else:
            raise TypeError(f"record must be True, False or a path, got {record!r}")
        path = claim_record_path(path)
        self.session.record = str(path)
        return Recorder(
            path,
            self.session,
            self.telemetry,
            self._emit_event,
            private_dir=private_dir,
            before=summary_build.preload,
            on_stopped=_say_recording_stopped,
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
            self._write_metadata()

    def _write_metadata(self) -> None:
        assert self.socket_path is not None
        discovery.write_metadata(
            self.socket_path,
            {
                "name": self.name,
                "pid": self._pid,
                "host": self.session.host,
                "start_time": self.session.start_time,
            },
        )

    def _socket_rebound(self) -> None:
        """The agent thread made the socket again after someone deleted it."""
        with contextlib.suppress(OSError):
            self._write_metadata()
        self._warning(
            "socket_rebound", f"the socket {self.socket_path} was deleted; bsmon made it again"
        )

    def _degrade(self, reason: str) -> None:
        self.serving = Capability(False, reason)
        warnings.warn(
            f"bsmon: not serving a socket, the job goes on unmonitored: {reason}",
            RuntimeWarning,
            stacklevel=4,
        )

    # -- training thread, at the steps the hot path was asked for ----------------------------

    def _at_boundary(self, step: int, now: float) -> int:
        """The slow path at the end of ``step``: apply what is due and get the next step
        ready; returns the next step whose end needs it."""
        following = NEVER
        control = self.batch_control
        if control is not None:
            control.at_step_boundary()
            if control.size != control.last_good or control.synced or control.due_at_boundary:
                following = step + 1  # the change's first step ends: it is the last good size
        if self._ddp_timing.model is not None:
            self._ddp_timing.at_step(step)
            following = min(following, (step // DDP_SAMPLE_EVERY + 1) * DDP_SAMPLE_EVERY)
        if not self._watch.armed:
            self._watch.arm()
        following = min(following, self._prepare_example_count(step, control))
        intake = self.telemetry.logged_intake
        if intake.timing_start and (logging_next := intake.early(step, now)) is not None:
            following = min(following, logging_next)
        noise_due = self._prepare_noise(step)
        sampling = self._prepare_anatomy(step, now)
        hot = self._hot
        hot.noise_due, hot.sampling = noise_due, sampling
        hot.need_pre_hook(noise_due or sampling)
        for listener in self._boundary_listeners:
            listener(sampling)
        if noise_due or sampling:
            return min(following, step + 1)
        noise_next = self._noise.next_measured - 1 if self._noise.source is not None else NEVER
        anatomy_next = self._anatomy_sampler.next_step - 1 if self._phases is not None else NEVER
        return min(following, noise_next, anatomy_next)

    def _prepare_example_count(self, step: int, control: Any) -> int:
        """Count the model's examples on step + 1 if nothing else says its samples (no
        DataLoader, no declared size), and the step the count next changes at."""
        tally, counter = self.telemetry.tally, self._model_examples
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
        if not self._anatomy_sampler.due(step + 1):
            phases.disarm()
            return False
        phases.arm(now)
        return phases.armed

    def _on_loader(self, iterator: Any, batch: Any, started: float, finished: float) -> None:
        """Any DataLoader's batch (loader_watch): training or evaluation activity; a
        training batch's samples count toward the step."""
        try:
            model = self.model
            if not torch.is_grad_enabled() or (model is not None and not model.training):
                self._evals.evaluate(finished)
                return
            self._evals.train(finished)
            if self._phases is not None and self._hot.sampling and batch is not None:
                self._phases.batch(started, finished)
                if self._loader_facts is None or self._loader_facts[0] != id(iterator):
                    self._loader_facts = (id(iterator), loader_facts(iterator))
            n = batch_length(batch) if batch is not None else None
            if n is None:
                return
            known = self._loader_sizes
            if known[0]() is not iterator:  # a new iterator (an epoch): its facts, once
                known = self._loader_sizes = self._sizes_of(iterator)
                self.training_epochs += 1
                if self.on_new_training_iterator is not None:
                    self.on_new_training_iterator(iterator)
            if known[1]:
                self._samples.draw(n, known[2])
        except Exception as exc:
            self._guard.report("DataLoader batch accounting", exc)

    @staticmethod
    def _sizes_of(iterator: Any) -> tuple[Callable[[], Any], bool, int | None]:
        """(a weak reference to the iterator, whether its batches count as samples here — not
        bsmon's own resizable loader's, which counts them itself — and its nominal size)."""
        try:
            ref: Callable[[], Any] = weakref.ref(iterator)
        except TypeError:
            ref = lambda: None  # noqa: E731  (never matches: looked up on every batch)
        counted = not isinstance(iterator._index_sampler, DynamicBatchSampler)
        return ref, counted, loader_watch.nominal_batch_size(iterator)

    def _on_mode_switch(self, module: Any, _result: Any, started: float, finished: float) -> None:
        """``model.eval()`` starts an evaluation, ``model.train()`` ends it (mode_watch)."""
        if module is not self.model:
            return  # one of its submodules, or another model
        try:
            if module.training:
                if self._evals.open:
                    self._evals.evaluate(started)
                self._evals.train(finished)
            else:
                self._evals.evaluate(finished)
        except Exception as exc:
            self._guard.report("model.train()/eval() accounting", exc)

    def _on_root_pass(self, root_pass: RootPass, _output: Any) -> None:
        if root_pass.grad and root_pass.training:
            self._evals.train(time.perf_counter())
        else:
            self._evals.evaluate(time.perf_counter())

    def _samples_reason(self, step: int) -> str | None:
        """Agent thread: why step ``step``'s samples are unknown, warned once (None for the
        first step: the model's inputs are counted from the second on)."""
        if step <= 1:
            return None
        watch = self._watch
        seen = watch.blocked() or watch.uncounted or "the model's own forward was not called"
        fix = audience.say(
            attach="attach(..., batch_size=N) declares them",
            run="bsmon run counts the batches of a DataLoader or the model's input",
        )
        reason = f"samples not counted: no DataLoader batch was seen and {seen}; {fix}"
        self._warn("samples_not_counted", reason)
        return reason

    def _on_batch(self, loader: MonitoredDataLoader, batch: Any, indices: list[int]) -> None:
        try:
            n = batch_length(batch)
            size = n if n is not None else len(indices)
            self._samples.count(size, one_pass=True)
            self._hot.batches_since_step.append((loader, indices))
            self.probe_source.offer(batch, size)
            if self._has_batchnorm and size < loader.dynamic_sampler.current_size():
                self._warn_uneven_batch(size)
        except Exception as exc:
            self._guard.report("dataloader batch accounting", exc)

    def _warn_uneven_batch(self, size: int) -> None:
        self._warn(
            "uneven_batchnorm_batch",
            f"a batch of {size} samples (the end of an epoch) meets BatchNorm in training "
            "mode: its statistics from so few samples are noisy, and NaN or an error "
            "with 1; pass drop_last=True to mon.dataloader",
        )

    def _emit_event(self, event: Event) -> None:
        self._inbox.append(event)

    def count_samples(self, samples: int, batch_size: int | None = None) -> None:
        """Count ``samples`` toward the step in progress, for batches from loaders bsmon did not
        make (``bsmon run``, the framework integrations). Without batch control, the first
        ``batch_size`` of a step (default: ``samples``) is reported as the job's batch size."""
        self._samples.count(samples, batch_size)

    def emit(self, event: Event) -> None:
        """Add ``event`` to the job's events (shown by the monitor); O(1), any thread."""
        self._emit_event(event)

    def report_error(self, where: str, exc: BaseException) -> None:
        """Count and show an exception caught in bsmon code outside the Monitor (an
        integration's hook); the job never sees it."""
        self._guard.report(where, exc)

    # -- public API ---------------------------------------------------------------------------

    @property
    def batch_size(self) -> int | None:
        """The current batch size (in accumulation mode: the effective batch per step)."""
        return self.batch_control.size if self.batch_control is not None else None

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
        control = self.batch_control
        return control.loader_size if control is not None else None

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per optimizer step (1 unless attach(micro_batch_size=...))."""
        return self.batch_control.accumulation_steps if self.batch_control is not None else 1

    @property
    def step(self) -> int:
        return self._progress.step

    @property
    def noise_scale(self) -> float | None:
        return self.telemetry.noise.b_simple

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

    def loss_given(self, loss: Any) -> None:
        """A framework's ``backward(loss)`` was called (``bsmon run``, accelerate): show
        ``loss`` as the loss, not the scalar that framework then calls ``backward()`` on (one
        append)."""
        self._inbox.losses.append((loss,))  # a tuple: given, not seen at backward()

    def record_backward_loss(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``Tensor.backward`` that also shows the tensor as the loss (``bsmon run``): one
        append on the training thread; the agent thread keeps it if it is a scalar."""
        return self._hot.loss_at_backward(original)

    def watch_every_optimizer(self, on_other: Callable[[Any, float], None]) -> None:
        """Training thread: ``on_other(optimizer, end)`` at the end of each step of an optimizer
        other than the one followed (``bsmon run``); the followed one's steps cost the same."""
        self._hot.every_optimizer(on_other)

    def follow_optimizer(self, optimizer: torch.optim.Optimizer, earlier: list[float]) -> None:
        """Training thread, in a post-hook of ``optimizer``'s step (from ``on_other``): count
        its steps from this one on, and the steps it took before, ending at ``earlier``, first;
        the followed optimizer stopped stepping (one optimizer per layer or stage, trained one
        after the other). The noise scale measured the parameters of the one before: it stops."""
        old = type(self.optimizer).__name__
        self._hot.follow(optimizer, earlier)
        self.optimizer = optimizer
        if self.batch_control is not None:
            self.batch_control.add_optimizer(optimizer)
        self._noise.refuse(
            f"it measured the gradients of the parameters {old} trains, and {old} stopped "
            f"stepping at step {self._progress.step - len(earlier)}"
        )

    def at_scheduled_boundaries(self, listener: Callable[[bool], None]) -> None:
        """Call ``listener(sampled)`` on the training thread at each step boundary the hot
        path schedules (at least at every step before and after a sampled one): ``sampled``
        says whether the next step is one the step anatomy samples."""
        self._boundary_listeners.append(listener)

    def dataloader(self, dataset: Any, **kwargs: Any) -> MonitoredDataLoader:
        """A DataLoader whose batch size follows ``mon.batch_size`` for every batch."""
        control = self.batch_control
        if control is None:
            raise ValueError("mon.dataloader() needs attach(..., batch_size=N)")
        sampler = kwargs.get("sampler")
        if isinstance(sampler, torch.utils.data.DistributedSampler) and hasattr(dataset, "__len__"):
            samples, world = len(dataset), sampler.num_replicas
            if samples % world:
                how = "drops" if sampler.drop_last else "pads with repeated"
                self._warn(
                    "uneven_world_split",
                    f"{samples} samples do not split evenly over {world} ranks: "
                    f"DistributedSampler {how} samples every epoch",
                )
        return make_dataloader(dataset, lambda: control.loader_size, self._on_batch, **kwargs)

    def training_iterator(self) -> Any:
        """The DataLoader iterator the job's training batches come from now (None: none)."""
        return self._loader_sizes[0]()

    def on_batch_size_change(self, callback: Callable[[int, int], None]) -> None:
        """Call ``callback(old, new)`` on the training thread whenever the batch size changes."""
        if self.batch_control is None:
            raise ValueError("on_batch_size_change() needs attach(..., batch_size=N)")
        self.batch_control.add_callback(callback)

    def request_batch_size(self, value: int, confirm: bool = False) -> protocol.Reply:
        """Ask for a new batch size through the same path and checks as the monitor's command."""
        fields = {"type": "set_batch_size", "id": "api", "value": value, "confirm": confirm}
        return self.router.handle_fields({**fields, "reason": "requested by the job"})

    def set_autopilot(self, on: bool) -> protocol.Reply:
        """Switch the autopilot on or off through the same path as the monitor's ``a`` key."""
        return self.router.handle_fields({"type": "autopilot", "id": "api", "on": on})

    def autopilot_reading(self) -> protocol.AutopilotReading | None:
        """What the autopilot sees and did (None: this job has none: no batch size declared,
        or not rank 0)."""
        return self.autopilot.reading() if self.autopilot is not None else None

    def probe(self, memory_budget: int | None = None, timeout: float = 600.0) -> ProbeResult:
        """Run the max-batch-size probe in a sidecar process and wait for its result.

        The job's state is not touched, but this call blocks the calling thread until the
        probe ends (the dashboard's ``p`` runs it without blocking the job). On the CPU,
        ``memory_budget`` (bytes) plays the device's memory.
        """
        reply = self.router.handle(
            protocol.encode(
                protocol.ProbeCommand(id="api", memory_budget=memory_budget, timeout_s=timeout)
            )
        )
        if not reply.ok:
            return ProbeResult(status="refused", error=reply.error)
        result = self.prober.wait(timeout + 60)
        return result or ProbeResult(status="timeout", error="the probe did not finish")

    def set_probe_batch(self, batch: Any) -> None:
        """Give the probe a batch to grow (for loops that do not use mon.dataloader)."""
        n = batch_length(batch)
        if n is None:
            raise ValueError("set_probe_batch() needs a tensor, or a tuple/list/dict of tensors")
        self.probe_source.offer(batch, n)

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Wrap forward and backward: an out-of-memory error is caught, memory freed, the
        batch size returned to the last size that ran, and the samples of the step re-queued
        in ``mon.dataloader`` so none is lost. Other errors pass through."""
        try:
            yield
        except Exception as exc:
            if not is_out_of_memory(exc) or not self._recover_from_oom(exc):
                raise

    def _recover_from_oom(self, exc: BaseException) -> bool:
        control = self.batch_control
        if control is None or self.session.world_size > 1:
            return False  # nothing to shrink to, or other ranks would hang in the all-reduce
        failed = control.size
        arrived = control.arrived
        cause = f" ({arrived.reason})" if arrived is not None and arrived.value == failed else ""
        fallback = control.shrink_after_oom(self._progress.step)
        if fallback is None:
            return False
        exc.__traceback__ = None  # its frames hold the failed step's activations
        self.optimizer.zero_grad(set_to_none=True)
        release_memory()
        requeued = 0
        for loader, indices in self._hot.batches_since_step:
            loader.requeue(indices)
            requeued += len(indices)
        self._hot.batches_since_step = []
        self._samples.discard()
        if self._phases is not None:
            self._phases.discard()
        self._hot.micro_batches = 0
        self._hot.wake()
        if fallback != control.size:
            control.switch(Pending(fallback, f"out of memory at {failed}", "oom guard"))
        again = (
            f"{requeued} samples will run again in batches of {control.loader_size}"
            if requeued
            else "its samples are skipped (mon.dataloader re-runs them)"
        )
        now = (
            f"now {control.accumulation_steps} micro-batches of {control.loader_size}"
            if control.micro is not None
            else f"back to {control.size}, the last size that ran"
        )
        self._emit_event(
            Event(
                t=time.time(),
                step=self._progress.step,
                kind="oom",
                level="warning",
                message=f"out of memory at batch {failed}{cause}; {now}; {again}",
                data={"failed": failed, "now": control.size, "requeued": requeued},
            )
        )
        return True

    def stats(self) -> dict[str, Any]:
        """A snapshot of what the monitor shows (aggregates lag the training thread by ≤ a tick)."""
        t = self.telemetry
        return {
            "name": self.name,
            "step": self._progress.step,
            "batch_size": self.batch_size,
            "samples": t.samples,
            "step_time_s": t.step_time_s,
            "samples_per_s": t.samples_per_s,
            "b_simple": t.noise.b_simple,
            "noise": {name: getattr(t.noise, name) for name in t.noise.__struct_fields__},
            "anatomy": self._anatomy.latest_dict() if self._anatomy is not None else None,
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
        self._inbox.append(Flush(done))
        self._service.wake()
        return done.wait(timeout)

    def record_probe_result(self, result: dict[str, Any]) -> None:
        """Put a probe's result in the session record (any thread; never raises)."""
        if self.recorder is not None:
            self.recorder.probe(result, self._progress.step)

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
                if self.recorder is not None:
                    cut = f"{reason}; bsmon's close was cut short ({type(exc).__name__})"
                    if self.recorder.close(cut, self._progress.step):
                        self._write_summary(self.recorder.path)

    def close(self, reason: str = "closed") -> None:
        """Remove every hook, stop every thread, remove the socket, end the record and write
        its summary beside it. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._hot.remove()
        if self._shared is not None:
            self._shared.remove()
        loader_watch.unsubscribe(self._on_loader)
        mode_watch.unsubscribe(self._on_mode_switch)
        if self._phases is not None:
            self._phases.remove()
        self._noise.close()
        self.probe_source.close()
        self._model_examples.remove()
        self._watch.close()
        self.prober.stop()
        if self._ranks_exchange is not None:
            self._ranks_exchange.close()
        atexit.unregister(self._close_at_exit)
        _live_monitors.discard(self)
        if os.getpid() != self._pid:
            return  # a forked child: the threads and the socket belong to the parent
        if self.batch_control is not None and (never := self.batch_control.unapplied()):
            self._warning("batch_size_unapplied", never)
        if self.autopilot is not None:
            try:
                self.autopilot.finish()
            except Exception as exc:  # its last word is not worth the job's clean end
                self._guard.report("the autopilot's last word", exc)
        self._service.stop(reason)
        self._hot.let_go()  # the last tick's tensors: no step is left to drop them
        if self.socket_path is not None:
            discovery.remove_job_files(self.socket_path)
        if self.recorder is not None and self.recorder.close(reason, self._progress.step):
            self._write_summary(self.recorder.path, said=self.recorder.failed is not None)
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
