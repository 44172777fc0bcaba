"""The composition root: ``attach()``'s options → every wing's part, joined, for a ``Monitor``.

The order matters where a part takes another: the noise scale's hints read the batch control
made after it (through the monitor), the hot path takes the batch control, and the scheduled
boundary takes the parts it prepares once they are all made.

Why one module: it is the one place where every wing's part meets the others; split, the
order above would be spread over files that each see only part of it."""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from typing import TYPE_CHECKING

import torch

from ..anatomy.collectives import CollectiveMarks
from ..anatomy.extension import AnatomyExtension
from ..anatomy.marks import PhaseMarks
from ..anatomy.sampling import STRIDE_VARIABLE, AnatomySampler, stride_from_environment
from ..batch.adam_rules import AdamRules
from ..batch.advisor import Advisor
from ..batch.autopilot import Autopilot
from ..batch.control import BatchController
from ..batch.extension import (
    AdvisorExtension,
    AutopilotExtension,
    BatchExtension,
    register_autopilot,
)
from ..batch.extension import register_commands as register_batch_commands
from ..batch.footprint import footprint_of
from ..batch.oom_recovery import OomRecovery
from ..batch.policy import BatchPolicy
from ..batch.regather import RegatherCost
from ..maxbatch.job import SHARDED as SHARDED_PROBE
from ..maxbatch.job import ProbeSource, device_free
from ..maxbatch.runner import ProbeExtension, ProbeRunner
from ..noise import NoiseExtension, NoiseScale
from ..noise.autograd import ExampleCounter
from ..noise.budget import budget_from_environment
from ..noise.shared_backward import SharedBackward
from ..runtime import distributed
from ..runtime.context import JobContext
from ..runtime.devices import DeviceSampler
from ..runtime.evaluation import EvalClock
from ..runtime.fault_guard import FaultGuard
from ..runtime.forward_watch import ForwardWatch
from ..runtime.hot_path import HotPath, StepWork
from ..runtime.inbox import Inbox
from ..runtime.memory_pressure import MemoryPressure
from ..runtime.progress import Progress
from ..runtime.ranks import DdpTiming, RankExchange, RanksExtension, rank_summary, store_for
from ..runtime.samples import StepSamples
from ..runtime.service import AgentService, Extension, PeriodicSampler, takes_boundaries
from ..runtime.session import default_name, session_info
from ..runtime.telemetry import Telemetry
from ..runtime.timing import StepClock
from ..throughput.extension import ThroughputExtension
from ..wire import protocol
from ..wire.protocol import Capability, ProbeResult
from ..wire.routing import CommandRouter
from . import serving
from .accounting import Accounting
from .boundary import Boundary, TakesBoundaries
from .job import Job
from .options import Options

if TYPE_CHECKING:
    from .monitor import Monitor

REEVALUATES = (
    "LBFGS evaluates its closure several times per step, each at other parameters, so a "
    "step's gradient noise is not defined"
)
SMALL_DEVICE_BATCH = 8  # a per-device batch below this mostly leaves the device waiting
_ranks_serials = itertools.count()  # every rank attaches in the same order: same namespaces


def assemble(
    mon: Monitor, model: torch.nn.Module | None, optimizer: torch.optim.Optimizer, o: Options
) -> None:
    """Build every part of ``mon`` from the checked options and join them."""
    job = mon.job = Job()
    job.model = model
    job.optimizer = optimizer
    job.loss_fn = o.loss_fn
    job.name = o.name or default_name()
    job.noise_window = o.noise_window
    job.record = o.record
    mon._pid = os.getpid()
    mon._closed = False
    mon._close_lock = threading.RLock()  # re-entered by the SIGTERM handler

    # training-thread state
    mon._progress = Progress()
    mon._samples = StepSamples(mon._progress)
    mon._inbox = Inbox()
    mon._log_into = mon._inbox.logged.append  # or latest.update: runtime.logged
    mon._guard = FaultGuard(mon._inbox.append, mon._progress)
    mon.session = session_info(job.name)
    ctx = mon._ctx = JobContext(mon._progress, mon._inbox.append, mon._guard, mon.session)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    mon._clock = StepClock.for_parameters(params)
    fsdp2 = mon.session.world_size > 1 and distributed.fsdp2_of(model)
    collectives = CollectiveMarks(mon._clock) if fsdp2 else None
    mon._phases = PhaseMarks(mon._clock, collectives) if o.step_anatomy else None
    stride, stride_error = stride_from_environment()
    anatomy_sampler = AnatomySampler(
        stride, follows_rate=not os.environ.get(STRIDE_VARIABLE) or stride_error is not None
    )
    mon._watch = ForwardWatch(model, mon._guard, o.batch_dim)
    ring = mon._inbox.ring
    evals = EvalClock(
        time.perf_counter(), mon._progress, lambda: ring.ends[ring.written & ring.mask]
    )
    mon._watch.on_root(evals.on_root_pass)
    mon._model_examples = ExampleCounter(mon._watch, "samples")
    job.batch_control = None  # made below; the noise scale's hints read it when they run
    noise_budget, budget_error = budget_from_environment(o.noise_budget)
    mon._noise = NoiseScale(
        model,
        optimizer,
        mode=o.noise_scale,
        window=o.noise_window,
        ctx=ctx,
        grad_scaler=o.grad_scaler,
        preconditioned=o.noise_preconditioned,
        budget=noise_budget,
        watch=mon._watch,
        examples_hint=lambda: mon._samples.so_far or mon.batch_size,
        pass_hint=mon._pass_examples,
        examples_known=lambda: mon._pass_examples() is not None,
        step_time=lambda: job.telemetry.step_time_s,
    )
    if budget_error is not None:
        ctx.warn_once("noise_budget", budget_error)

    rank, world_size = mon.session.rank, mon.session.world_size
    ddp = distributed.ddp_of(model, params) if world_size > 1 else None
    if world_size > 1:  # in the record's header too: the step anatomy's note reads it
        mon.session.ddp = ddp is not None
        mon.session.fsdp2 = fsdp2
    job.telemetry = Telemetry()
    job.telemetry.batch_size = o.batch_size
    job.telemetry.report = mon._guard.report
    job.recorder = serving.make_recorder(
        o.record,
        o.socket_dir,
        session=mon.session,
        telemetry=job.telemetry,
        emit=mon._ctx.emit,
        noise=mon._noise,
        name=job.name,
        pid=mon._pid,
    )
    job.router = CommandRouter()
    job.batch_control = make_batch_control(
        mon,
        o.batch_size,
        BatchPolicy(o.batch_step, o.min_batch_size, o.max_batch_size, o.micro_batch_size or 1),
        micro_batch_size=o.micro_batch_size,
        lr_scaling=o.lr_scaling,
        lr_scheduler=o.lr_scheduler,
        adam_rules=o.adam_rules(),
        rank=rank,
        world_size=world_size,
    )
    reevaluates = isinstance(optimizer, torch.optim.LBFGS)
    work = StepWork()
    work.noise_step = mon._noise.on_step
    if mon._phases is not None:
        work.optimizer_starting = mon._phases.optimizer_starting
        work.take_marks = mon._phases.take
    mon._hot = HotPath(
        optimizer,
        mon._inbox,
        mon._progress,
        mon._guard,
        work,
        samples=mon._samples,
        examples=mon._model_examples,
        evals=evals,
        reevaluates=reevaluates,
    )
    mon._hot.control = job.batch_control
    mon._oom = (  # nothing to shrink to, or other ranks would hang in the all-reduce
        OomRecovery(
            job.batch_control,
            mon._hot,
            samples=mon._samples,
            ctx=ctx,
            discard_marks=mon._phases.discard if mon._phases is not None else lambda: None,
        )
        if job.batch_control is not None and world_size == 1
        else None
    )
    job.telemetry.hand_back = mon._hot.hand_back
    job.telemetry.logged_intake.keep_latest = mon._keep_latest_logged
    mon._hot.need_pre_hook(mon._noise.due(1))
    mon._hot.noise_due = mon._noise.due(1)
    if reevaluates:
        mon._noise.refuse(REEVALUATES)
    shared = (  # the estimate's only concern: nothing to watch when it is off
        SharedBackward(model, optimizer, mon._noise.refuse, mon._guard)
        if mon._noise.source is not None
        else None
    )
    mon.socket_path = None
    job.serving = Capability(False, "serve=False")
    job.probe_source = ProbeSource(
        model, optimizer, o.loss_fn, o.probe_step, job.batch_control, watch=mon._watch
    )
    mon._accounting = Accounting(
        model,
        samples=mon._samples,
        evals=evals,
        watch=mon._watch,
        phases=mon._phases,
        hot=mon._hot,
        probe_source=job.probe_source,
        ctx=ctx,
        tally=job.telemetry.tally,
        examples=mon._model_examples,
        declared=job.batch_control is not None,
    )
    job.telemetry.samples_reason = mon._accounting.samples_reason
    mon._accounting.subscribe()
    if o.serve:
        mon.socket_path = serving.prepare_socket(mon, o.socket_dir)
    job.prober = make_prober(mon, rank)
    if job.batch_control is not None:
        job.batch_control.watch.device_shared_since = job.prober.ran_since
    mon._throughput = ThroughputExtension(mon._watch, model, ctx)
    extensions: list[Extension] = [
        NoiseExtension(mon._noise, job.telemetry, hot=mon._hot, shared=shared),
        ProbeExtension(job.prober),
        mon._throughput,
        MemoryPressure(ctx),
    ]
    # reads nothing unless the job is distributed and its model DistributedDataParallel
    ddp_timing = DdpTiming(ddp)
    job.telemetry.comm_sample = ddp_timing.comm_wait
    mon._anatomy = None
    if mon._phases is not None:
        mon._phases.install()
        if stride_error is not None:
            mon._ctx.warn_once("anatomy_stride", stride_error)
        mon._anatomy = anatomy_extension(mon, world_size, anatomy_sampler)
        extensions.append(mon._anatomy)
    mon._ranks = None
    if world_size > 1 and o.ranks_view and (ranks := make_ranks(mon, rank, world_size, ddp_timing)):
        mon._ranks = ranks
        extensions.append(ranks)
    if job.batch_control is not None:
        extensions.append(BatchExtension(job.batch_control, job.telemetry, warn=ctx.warn))
    sampler = PeriodicSampler(DeviceSampler(), o.sample_interval_s)
    job.autopilot = make_autopilot(mon, rank, world_size, o.autopilot_half_batch)
    if job.autopilot is not None:
        extensions.append(
            AutopilotExtension(
                job.autopilot, job.batch_control, sampler.sample_soon, report=mon._guard.report
            )
        )
        extensions.append(AdvisorExtension(job.autopilot.advisor, mon._ctx.emit))
    if job.recorder is not None:
        extensions.append(job.recorder)
    runtime_parts: list[TakesBoundaries] = [
        mon._watch,
        mon._accounting,
        job.telemetry.logged_intake,
    ]
    if ddp_timing.model is not None:  # reads nothing unless the model is DDP
        runtime_parts.insert(0, ddp_timing)
    if job.batch_control is not None:  # a pending size is applied first
        runtime_parts.insert(0, job.batch_control)
    mon._boundary = Boundary(
        [*runtime_parts, *(part for part in extensions if takes_boundaries(part))], mon._hot
    )
    work.on_boundary = mon._boundary.at_boundary
    job.ctx, job.noise, job.inbox, job.samples = ctx, mon._noise, mon._inbox, mon._samples
    job.hot, job.accounting, job.boundary = mon._hot, mon._accounting, mon._boundary
    mon._service = AgentService(
        inbox=mon._inbox,
        telemetry=job.telemetry,
        router=job.router,
        sampler=sampler,
        session=mon.session,
        socket_path=mon.socket_path,
        fault_count=lambda: mon._guard.count,
        noise_capability=lambda: mon._noise.capability,
        extensions=extensions,
        on_rebound=lambda: serving.socket_rebound(mon),
        report=mon._guard.report,
    )
    if job.recorder is not None:
        job.recorder.start()
    serving.start_service(mon)


def make_batch_control(
    mon: Monitor,
    batch_size: int | None,
    policy: BatchPolicy,
    *,
    micro_batch_size: int | None,
    lr_scaling: str | None,
    lr_scheduler: object,
    adam_rules: AdamRules,
    rank: int,
    world_size: int,
) -> BatchController | None:
    if batch_size is None:
        reason = "the job declared no batch size (attach(..., batch_size=N) enables it)"
        for kind in ("set_batch_size", "step_batch_size"):
            mon.job.router.disable(kind, reason)
        return None
    if (refusal := policy.refusal(batch_size)) is not None:
        raise ValueError(f"batch_size: {refusal}")
    group = distributed.control_group() if world_size > 1 else None
    controller = BatchController(
        initial=batch_size,
        policy=policy,
        micro_batch_size=micro_batch_size,
        optimizer=mon.job.optimizer,
        lr_scaling=lr_scaling,
        scheduler=lr_scheduler,
        emit=mon._ctx.emit,
        record=mon._inbox.append,
        guard=mon._guard,
        step=mon._progress,
        noise_scale=lambda: mon.noise_scale,
        sync=distributed.StepSync(group, rank) if group is not None else None,
        rank=rank,
        wake=lambda: mon._hot.wake(),  # noqa: PLW0108 (mon._hot is made later)
        footprint=lambda: footprint_of(mon.job.model, mon.job.optimizer),
        adam_rules=adam_rules,
    )
    register_batch_commands(mon.job.router, controller)
    if rank != 0:
        for kind in ("set_batch_size", "step_batch_size"):
            mon.job.router.disable(kind, "send batch-size commands to rank 0's monitor")
    return controller


def make_autopilot(
    mon: Monitor, rank: int, world_size: int, declared_half: float | None
) -> Autopilot | None:
    """The autopilot, off until switched on (rank 0 decides for every rank), and the advisor
    it acts on."""
    control = mon.job.batch_control
    if control is None or rank != 0:
        why = (
            "send autopilot commands to rank 0's monitor"
            if control
            else ("the job declared no batch size (attach(..., batch_size=N) enables it)")
        )
        mon.job.router.disable("autopilot", why)
        return None
    noise = mon._noise
    autopilot = Autopilot(
        control,
        noise_refusal=lambda: None if noise.capability.available else noise.capability.reason,
        emit=mon._ctx.emit,
        step=mon._progress,
        plain_step_s=lambda: noise.budget.plain_step_s,
        epochs=lambda: mon._accounting.training_epochs,
        advisor=Advisor(
            control, declared_half=declared_half, regather=regather_cost(mon, world_size)
        ),
    )
    register_autopilot(mon.job.router, autopilot)
    return autopilot


def regather_cost(mon: Monitor, world_size: int) -> RegatherCost:
    control, anatomy = mon.job.batch_control, mon._anatomy
    assert control is not None
    return RegatherCost(
        lambda: control.memory.footprint,
        micro_batch=lambda: control.micro,
        world_size=world_size,
        device_type=mon._clock.device.type if mon._clock.device is not None else "cpu",
        anatomy=lambda: anatomy.latest if anatomy is not None else None,
    )


def make_ranks(
    mon: Monitor, rank: int, world_size: int, ddp_timing: DdpTiming
) -> RanksExtension | None:
    """Rank 0's view of every rank, through the job's rendezvous store (no collective)."""
    try:
        store = store_for(next(_ranks_serials))
    except Exception as exc:
        mon._ctx.warn_once(
            "ranks_view_unavailable",
            f"no ranks view: the job's store is not reachable ({type(exc).__name__}: {exc})",
        )
        return None
    exchange = RankExchange(store, rank, world_size)
    if mon.job.batch_control is not None and mon.job.batch_control.size < SMALL_DEVICE_BATCH:
        mon._ctx.warn_once(
            "small_device_batch",
            f"the per-device batch is {mon.job.batch_control.size}: below "
            f"{SMALL_DEVICE_BATCH} samples a device mostly waits; consider gradient "
            "accumulation (micro_batch_size) or fewer ranks",
        )
    placement = (socket.gethostname(), int(os.environ.get("LOCAL_RANK", "0")))
    fsdp2 = bool(mon.session.fsdp2)
    return RanksExtension(exchange, placement, rank_summary, ddp_timing, fsdp2=fsdp2)


def anatomy_extension(mon: Monitor, world_size: int, sampler: AnatomySampler) -> AnatomyExtension:
    device = mon._clock.device
    return AnatomyExtension(
        mon.job.telemetry,
        world_size=world_size,
        ddp=mon.session.ddp,
        fsdp2=mon.session.fsdp2,
        loader=mon._accounting.loader,
        device_index=device.index if device is not None else None,
        ctx=mon._ctx,
        sampler=sampler,
        phases=mon._phases,
        hot=mon._hot,
    )


def make_prober(mon: Monitor, rank: int) -> ProbeRunner:
    source = mon.job.probe_source
    device = next(
        (p.device for g in mon.job.optimizer.param_groups for p in g["params"]),
        torch.device("cpu"),
    )
    runner = ProbeRunner(
        check=source.check,
        prepare=source.recipe,
        directory=mon.socket_path.parent if mon.socket_path else None,
        ctx=mon._ctx,
        on_result=lambda result: probe_concluded(mon, source, result),
        device_free=lambda: device_free(device),
    )
    if rank != 0:
        mon.job.router.disable("probe", "send probe commands to rank 0's monitor")
    else:
        if source.sharded:  # said once, so the record says why no probe ran
            mon._ctx.emit(protocol.Event(time.time(), 0, "probe_unavailable", SHARDED_PROBE))
        mon.job.router.register(
            "probe", lambda command: runner.start(command.memory_budget, command.timeout_s)
        )  # type: ignore[attr-defined]
    return runner


def probe_concluded(mon: Monitor, source: ProbeSource, result: ProbeResult) -> None:
    """The probe's result: concluded (recommendation, batch control), then recorded."""
    try:
        source.conclude(result, mon.job.advisor)
    finally:
        mon.record_probe_result(protocol.to_builtins(result))
