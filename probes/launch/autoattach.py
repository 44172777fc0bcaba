"""Zero-code attach: the agent ``bsmon run`` loads into a training script nobody changed.

``boot/sitecustomize.py`` calls ``install()`` right after the process imports torch.
``install()`` starts nothing; it

- registers PyTorch's global optimizer step pre-hook, which fires for every optimizer,
  including ones created before it was registered. The first ``optimizer.step()`` of the
  process attaches a normal ``Monitor`` (so whatever the Monitor does, e.g. the noise scale,
  works here too) to that optimizer and to the model found through its parameters;
- watches DataLoader iteration (``loader_watch``), so the samples of the training batches
  each step draws are counted (batches drawn with gradients off or the model in ``eval()``
  mode are evaluation, not counted), with the loader's own batch size as the job's;
- wraps ``Tensor.backward``, so the scalar the script calls ``backward()`` on is shown as its
  loss (as the script computed it: divided for accumulation, or scaled by AMP, if it is).

Once attached, the per-step cost is the monitor's own (``runtime.hot_path``) plus one append
in ``backward()``: the global pre-step hook goes at the first step boundary, and the monitor's
post-step hook is torch's global one, which sees the other optimizers' steps: a second one is
named, and followed instead once the first has stopped stepping and it steps in its place.

A process that never steps an optimizer (torchrun's launcher, DataLoader workers, tools)
never attaches: no thread, no socket. It leaves ``bsmon run`` a note (``run_notes``) saying
why — a script that calls ``backward()`` but updates its parameters by hand is told apart
from one that never trained — and a process that trained without attaching also leaves a
record that says so. Nothing is written to the job's own output. Batch-size control is off,
with the reason and how to turn it on, unless ``bsmon run --resizable`` asked for it: then
the monitor's batch control drives the script's own training DataLoader
(``batch.script_loader``).

Why one module: the hooks installed here (the global step pre-hook, the backward wrapper, the
loader watch before the first step) and the attach they lead to are one state machine whose
states (waiting, attached, stood down, exiting) every callback reads.

Rules of the house: every callback is O(1) on the training thread, apart from the one-time
attach at the first step (which also scans the heap once for the model, ~0.1 s per 200k
objects); every exception inside bsmon code is caught, counted and shown as an event.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import os
import time
import weakref
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..batch.loader import batch_length
from ..batch.script_loader import (
    LengthReads,
    find_scheduler,
    framework_reason,
    take_control,
    why_not_resizable,
)
from ..integrations.common import disable_batch_control, note, rank_name
from ..maxbatch.seen_step import WAITING, StepWatch
from ..record.writer import write_unattached
from ..runtime import audience, distributed, loader_watch
from ..runtime.audience import ENV_AUTOPILOT, ENV_RESIZABLE
from ..runtime.distributed import find_deepspeed_engine
from ..runtime.fault_guard import FaultGuard
from ..summary.build import preload, write_summary_beside
from ..wire import discovery
from ..wire.protocol import Event
from . import accelerate_loss
from . import notes as run_notes

CONTROL_REASON = (
    "bsmon run leaves the script's DataLoader as it is; "
    "bsmon run --resizable makes its batch size controllable"
)
NO_LOADER_REASON = (
    "the script cuts its own batches (no DataLoader batch was seen before its first step), "
    "so bsmon cannot change them; docs/zero-code.md says what to change in the script"
)
PROBE_REASON = (
    "the probe needs the batch size under control: bsmon run --resizable, "
    "or attach(..., batch_size=N, loss_fn=...) in the script"
)
RESIZABLE_OFF = "bsmon run --resizable: "  # before why batch-size control is off all the same
EARLY_EVENTS = 20  # events kept from before the first step (errors in the wrappers)
EARLY_LOSSES = 256  # backward() scalars kept from before the first step (its micro-batches)
UNSTEPPED_BACKWARDS = 3  # backward() calls with no optimizer step before bsmon run is told
HAND_UPDATES = (
    "it calls backward() but steps no torch.optim optimizer (parameters updated by hand?); "
    "bsmon attaches at the first optimizer.step()"
)
NOTHING_TRAINED = "it stepped no torch.optim optimizer (nothing trained)"
# steps of another optimizer in a row, none of the followed one's between, before bsmon follows
# it: a GAN's optimizers alternate in shorter runs (WGAN's critic: 5 steps per generator step,
# 100 in its first 25 rounds and every 500th)
TAKE_OVER_AFTER = 128

_installed: list[AutoAttach] = []  # this process's agent, once installed


def install(name: str) -> AutoAttach | None:
    """Install the zero-code agent in this process (once); returns it, or None if it was
    already installed."""
    if _installed:
        return None
    agent = AutoAttach(name or _script_name())
    agent.install()
    _installed.append(agent)
    return agent


def installed() -> AutoAttach | None:
    return _installed[0] if _installed else None


def _script_name() -> str:
    from ..runtime.session import default_name

    return default_name()


class AutoAttach:
    def __init__(self, name: str) -> None:
        self.name = name
        self.monitor: Any = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.model: nn.Module | None = None
        self.stood_down: str | None = None  # why this process is not monitored, if it is not
        self.guard = FaultGuard(self._emit, lambda: self.monitor.step if self.monitor else 0)
        self._early: list[Event] = []
        self._early_losses: list[torch.Tensor] = []  # backward()'s scalars before attach
        self._others: set[int] = set()
        # another optimizer's steps in a row: (it, the followed one's step count, their ends)
        self._run: tuple[torch.optim.Optimizer, int, list[float]] | None = None
        self._total = 0  # training samples drawn before the first step
        self._first = 0  # the job's batch size, from the first training batch
        self._backwards = 0  # backward() calls before the first optimizer step
        self._unwrap: list[Any] = []  # puts back what install() changed
        self._hook: Any = None  # torch's global step pre-hook, while registered
        self._original_backward: Any = None
        self._backward: Any = None  # the wrapper install() put on Tensor.backward
        self._notes: tuple[Path, str] | None = None  # (bsmon directory, run id) of bsmon run
        self._script_attached = False
        self._started = time.time()
        self.resizable = os.environ.get(ENV_RESIZABLE) == "1"
        self.autopilot = os.environ.get(ENV_AUTOPILOT) == "1"
        self._first_iterator: Any = lambda: None  # weak: the first training batch's iterator
        self._lengths: LengthReads | None = None  # len(loader) reads, when resizable
        self._framework: str | None = None  # a trainer whose loop rules out resizing

    # -- installation ----------------------------------------------------------------------

    def install(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self._hook = register_optimizer_step_pre_hook(self._pre_step)
        if (why := loader_watch.subscribe(self._on_batch)) is not None:
            self._note_early(f"{why}: samples are not counted")
        else:
            self._unwrap.append(lambda: loader_watch.unsubscribe(self._on_batch))
        self._wrap_backward()
        if self.resizable:  # a progress bar reads len(loader) before the first step
            self._lengths = LengthReads()
            if self._lengths.start() is None:
                self._unwrap.append(self._lengths.stop)
        run_id = os.environ.get(run_notes.ENV_RUN_ID)
        if run_id:
            self._notes = (discovery.default_dir(), run_id)
            atexit.register(self._at_exit)

    def uninstall(self) -> None:
        """Undo ``install()`` and close the monitor (in-process tests and benchmarks; a
        ``bsmon run`` process keeps the agent until it exits)."""
        self._unwrap_all()
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.monitor is not None:
            self.monitor.close()
        audience.set_zero_code(False)

    def _unwrap_all(self) -> None:
        while self._unwrap:
            self._unwrap.pop()()

    def _wrap_backward(self) -> None:
        original = torch.Tensor.backward
        agent = self

        @functools.wraps(original)
        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            agent._on_backward(tensor)
            return original(tensor, *args, **kwargs)

        torch.Tensor.backward = backward  # type: ignore[method-assign]
        self._original_backward, self._backward = original, backward
        self._unwrap.append(lambda: setattr(torch.Tensor, "backward", original))

    def _lean_after_attach(self, monitor: Any) -> None:
        """Once attached, the per-step cost drops to the monitor's own: ``backward()`` hands
        its tensor over in one append, the monitor's post-step hook becomes torch's global one
        (the same call per step) and sees the other optimizers' steps, and the global pre-step
        hook (there to find the first optimizer) goes at the first step boundary."""
        if torch.Tensor.backward is self._backward:  # not wrapped again by someone since
            lean = monitor.job.record_backward_loss(self._original_backward)
            torch.Tensor.backward = lean  # type: ignore[method-assign]
        monitor.job.watch_every_optimizer(self._other_stepped)
        monitor.job.at_scheduled_boundaries(self._drop_pre_step_hook)

    def _drop_pre_step_hook(self, _sampled: bool) -> None:
        """At a step boundary (not inside torch's loop over the global hooks, which may not
        change while it runs)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    # -- training-thread callbacks -------------------------------------------------------------

    def _on_batch(self, iterator: Any, batch: Any, _started: float, _finished: float) -> None:
        """A DataLoader batch before the monitor exists (loader_watch): a training batch
        counts toward the first step; the monitor counts the later ones itself."""
        try:
            if batch is None or not torch.is_grad_enabled():
                return  # the end of an epoch, or an evaluation loop
            n = batch_length(batch)
            if n is None:
                return
            if not self._total:
                self._first = loader_watch.nominal_batch_size(iterator) or n
                with contextlib.suppress(TypeError):
                    self._first_iterator = weakref.ref(iterator)
            self._total += n
        except Exception as exc:
            self.guard.report("counting a DataLoader batch", exc)

    def _on_backward(self, tensor: torch.Tensor) -> None:
        try:
            if tensor.numel() != 1:
                return
            if self.monitor is not None:
                self.monitor.log(loss=tensor)
                return
            self._backwards += 1
            if self.stood_down is None and len(self._early_losses) < EARLY_LOSSES:
                self._early_losses.append(tensor.detach())
            if self._backwards == UNSTEPPED_BACKWARDS and self.optimizer is None:
                self._leave_note()  # bsmon run can say why while the job runs
                preload()  # before exit, where importing it could fail
        except Exception as exc:
            self.guard.report("reading the loss at backward()", exc)

    def _pre_step(self, optimizer: torch.optim.Optimizer, _args: Any, _kwargs: Any) -> None:
        try:
            if self.monitor is not None:
                if optimizer is not self.optimizer:
                    self._note_other(optimizer)
                return
            if self.stood_down is not None:
                return
            try:
                self._attach(optimizer)
            except Exception as exc:
                self._stand_down(f"could not attach ({type(exc).__name__}: {exc})")
            if self.monitor is not None:
                self._lean_after_attach(self.monitor)
                self._leave_note()  # said now: a job killed later never reaches its atexit
                loader_watch.unsubscribe(self._on_batch)  # the batches drawn before it count
                if self._total:  # toward the first step; the monitor counts the later ones
                    self.monitor.job.count_samples(self._total, self._first)
        except Exception as exc:
            self.guard.report("the optimizer step pre-hook", exc)

    # -- attach (once, at the first optimizer step) --------------------------------------------

    def _attach(self, optimizer: torch.optim.Optimizer) -> None:
        from ..agent import attach, live_monitors

        if any(True for _ in live_monitors()):
            self._script_attached = True
            self._stand_down("the script attaches bsmon itself; bsmon run leaves it to that")
            return
        started = time.perf_counter()
        scheduler = None
        accelerator = None
        try:
            objects = gc.get_objects()  # one scan of the heap for all four
            model = find_model(optimizer, objects) or find_deepspeed_engine(optimizer, objects)
            scaler = find_grad_scaler(objects)
            accelerator = accelerate_loss.find_accelerator(objects)
            if self.resizable:
                scheduler = find_scheduler(optimizer, objects)
                self._framework = framework_reason(objects)
            del objects
        except Exception as exc:
            model = scaler = None
            self.guard.report("looking for the model", exc)
        search_s = time.perf_counter() - started
        rank, world_size = distributed.world()
        control_off = self._control_reason()
        audience.set_zero_code(True)  # the reasons this monitor gives are for bsmon run's user
        monitor = attach(
            model,
            optimizer,
            name=rank_name(self.name, rank, world_size),
            grad_scaler=scaler,
            batch_size=None if control_off else self._first,
            lr_scheduler=scheduler,
            autopilot=self.autopilot and not control_off,
        )
        if control_off:
            disable_batch_control(monitor, control_off)
        else:
            loader = take_control(monitor, model, scheduler, self._first_iterator, self._lengths)
            self._unwrap.append(loader.stop)
        if (why_no_probe := self._probe_reason(control_off, model)) is not None:
            monitor.job.disable("probe", why_no_probe)
        else:  # the next training step says where the loss is
            monitor.job.why_no_probe(WAITING)
            StepWatch(model, monitor.job.probe_source.use_seen)
        self.monitor, self.optimizer, self.model = monitor, optimizer, model
        for event in self._early:
            monitor.job.emit(event)
        self._early.clear()
        loss_is = "the value backward() is called on"
        if accelerator is not None:
            loss_is = self._follow_accelerator(accelerator, monitor)
        for loss in self._early_losses:  # every micro-batch of an accumulating first step
            monitor.log(loss=loss)
        self._early_losses = []
        note(
            monitor,
            "zero_code",
            f"bsmon run: watching {describe_optimizer(optimizer)} training "
            f"{describe_model(model, optimizer)} (found in {search_s:.2f} s); the loss shown "
            f"is {loss_is}; "
            + (
                f"batch-size control is off: {control_off}"
                + ("; so is the autopilot (--autopilot), for that reason" if self.autopilot else "")
                if control_off
                else "the keys change the batch size of the script's DataLoader"
                + self._accumulation_words()
            ),
            optimizer=type(optimizer).__name__,
            model=type(model).__name__ if model is not None else None,
            search_s=round(search_s, 4),
        )

    def _accumulation_words(self) -> str:
        """A script that draws several batches per optimizer step (gradient accumulation)."""
        if self._first and self._total >= 2 * self._first:
            per_step = round(self._total / self._first)
            return f" ({self._first}); each optimizer step trains about {per_step} of them"
        return ""

    def _control_reason(self) -> str | None:
        """Why the batch size cannot be controlled (None: the script's loader can be)."""
        if not self.resizable:
            return CONTROL_REASON
        if not self._first:
            return NO_LOADER_REASON
        why = self._framework or why_not_resizable(self._first_iterator())
        return f"{RESIZABLE_OFF}{why}" if why is not None else None

    def _probe_reason(self, control_off: str | None, model: nn.Module | None) -> str | None:
        """Why the probe is off (None: it waits for the next training step); under
        --resizable the reason itself, not the advice to use --resizable."""
        if control_off is not None and not self.resizable:
            return PROBE_REASON
        if control_off is not None:
            why = control_off.removeprefix(RESIZABLE_OFF)
            return f"the probe needs the batch size under control; bsmon cannot change it: {why}"
        if model is None:
            return "the probe needs the model, and no nn.Module holds the optimizer's parameters"
        return None

    def _follow_accelerator(self, accelerator: Any, monitor: Any) -> str:
        """accelerate divides the loss before backward(): show the one it was given (the
        first step's, taken at backward() before this, multiplied back or left out)."""
        self._unwrap.append(accelerate_loss.wrap_backward(accelerator, monitor.job.loss_given))
        factor = accelerate_loss.early_loss_factor(accelerator)
        self._early_losses = [] if factor is None else [t * factor for t in self._early_losses]
        return "the value given to accelerator.backward(), not divided by the accumulation steps"

    def _stand_down(self, why: str) -> None:
        self.stood_down = why
        self._early.clear()
        self._early_losses = []
        self._unwrap_all()  # the hook stays (torch may be iterating over it); it does nothing
        self._leave_note()

    def _leave_note(self, record: str | None = None) -> None:
        """Tell bsmon run whether this process is monitored, and if not, why, and where its
        record is (``record``: one written without a monitor) (never raises)."""
        if self._notes is None:
            return
        attached = self.monitor is not None or self._script_attached
        trained = self._backwards > 0 or self.optimizer is not None
        if attached:
            reason = None
        elif self.stood_down is not None:
            reason = self.stood_down
        else:
            reason = HAND_UPDATES if trained else NOTHING_TRAINED
        record = record or getattr(getattr(self.monitor, "session", None), "record", None)
        recorder = getattr(getattr(self.monitor, "job", None), "recorder", None)
        stopped = recorder.failed if recorder is not None else None
        note = run_notes.Note(os.getpid(), attached, trained, reason, record, stopped)
        run_notes.write(*self._notes, note)

    def _at_exit(self) -> None:
        """The last word of a process that trained but was never monitored: its note, and a
        record that says why. Never raises (an exception here would change the exit code)."""
        record = None
        try:
            if self.monitor is None and not self._script_attached and self._backwards:
                from ..runtime.session import session_info

                session = session_info(self.name)
                session.start_time = self._started
                reason = self.stood_down or HAND_UPDATES
                path = write_unattached(discovery.records_dir(), session, reason)
                record = str(path)
                write_summary_beside(path)
        except Exception:  # nothing may escape at exit: the note and record are best effort
            pass
        self._leave_note(record)  # after the record, so that bsmon run can say where it is

    def _other_stepped(self, optimizer: torch.optim.Optimizer, end: float) -> None:
        """The end of a step of an optimizer bsmon does not follow (training thread): noted
        the first time; followed instead once it steps TAKE_OVER_AFTER times in a row with no
        step of the followed one (one optimizer per layer or stage, one after the other)."""
        run, step = self._run, self.monitor.step
        if run is None or run[0] is not optimizer or run[1] != step:
            self._run = (optimizer, step, [end])
            if id(optimizer) not in self._others:
                self._note_other(optimizer)
            return
        run[2].append(end)
        if len(run[2]) >= TAKE_OVER_AFTER:
            self._take_over(optimizer, run[2])

    def _take_over(self, optimizer: torch.optim.Optimizer, ends: list[float]) -> None:
        before, stopped = self.optimizer, self.monitor.step
        self._run = None
        self._others.add(id(before))
        self.monitor.job.follow_optimizer(optimizer, ends[:-1])  # the last: the step in progress
        self.optimizer = optimizer
        note(
            self.monitor,
            "zero_code",
            f"bsmon now counts the steps of {describe_optimizer(optimizer)}: it stepped "
            f"{len(ends)} times in a row with no step of {describe_optimizer(before)}, which "
            f"bsmon counted until step {stopped} (one optimizer per layer or stage, trained "
            "one after the other); those steps are counted, the loss shown is still the value "
            "backward() is called on",
            optimizer=type(optimizer).__name__,
            stopped=type(before).__name__,
        )

    def _note_other(self, optimizer: torch.optim.Optimizer) -> None:
        key = id(optimizer)
        if key in self._others or len(self._others) >= 8:
            return
        self._others.add(key)
        control = getattr(getattr(self.monitor, "job", None), "batch_control", None)
        follows = ""
        if control is not None:
            control.add_optimizer(optimizer)
            follows = (
                "; its learning rate follows the batch size too, and the loss shown mixes "
                "both optimizers' losses, so whether it holds after a change is not judged"
            )
        note(
            self.monitor,
            "zero_code",
            f"another optimizer steps too ({describe_optimizer(optimizer)}"
            f"{self._trains_more(optimizer)}); bsmon counts a step each time "
            f"{describe_optimizer(self.optimizer)} steps, the first that stepped, until the "
            f"other steps {TAKE_OVER_AFTER} times in a row without it; the loss shown is each "
            "value backward() is called on, both optimizers' if each has its own backward pass"
            f"{follows}",
        )

    def _trains_more(self, optimizer: torch.optim.Optimizer) -> str:
        """The parameters of the model ``optimizer`` trains (an optimizer per layer), if any."""
        if self.model is None:
            return ""
        own = {id(p) for group in optimizer.param_groups for p in group["params"]}
        count = sum(p.numel() for p in self.model.parameters() if id(p) in own)
        return f", training {count:,} parameters of {type(self.model).__name__}" if count else ""

    def _emit(self, event: Event) -> None:
        if self.monitor is not None:
            self.monitor.job.emit(event)
        elif len(self._early) < EARLY_EVENTS:
            self._early.append(event)

    def _note_early(self, message: str) -> None:
        self._emit(Event(t=time.time(), step=0, kind="zero_code", message=message, level="warning"))


# -- finding the model -----------------------------------------------------------------------


def find_model(
    optimizer: torch.optim.Optimizer, objects: list[Any] | None = None
) -> nn.Module | None:
    """The module the script trains with ``optimizer``: among the outermost modules alive
    (those no other module holds as a child), the one that holds the most of the optimizer's
    parameters, then the fewest others. A DDP or ``torch.compile`` wrapper is outermost, so it
    is the one found (it is what the script calls). None when no module holds any of them."""
    wanted = {id(p) for group in optimizer.param_groups for p in group["params"]}
    heap = gc.get_objects() if objects is None else objects
    modules = [obj for obj in heap if issubclass(type(obj), nn.Module)]
    children = {id(child) for module in modules for child in module._modules.values()}
    best: tuple[int, int] | None = None
    found = None
    for module in modules:
        if id(module) in children:
            continue
        ids = {id(p) for p in module.parameters()}
        held = len(ids & wanted)
        if not held:
            continue
        score = (held, -len(ids - wanted))
        if best is None or score > best:
            best, found = score, module
    return found


def find_grad_scaler(objects: list[Any] | None = None) -> Any:
    """The job's ``torch.amp.GradScaler`` when it has exactly one (its loss scale is divided
    out of the gradients bsmon measures); None otherwise."""
    scaler_class = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if scaler_class is None:
        return None
    heap = gc.get_objects() if objects is None else objects
    scalers = [
        obj for obj in heap if issubclass(type(obj), scaler_class)
    ]  # type(): no __class__ lookups, which warn on some objects
    return scalers[0] if len(scalers) == 1 else None


def describe_model(model: nn.Module | None, optimizer: torch.optim.Optimizer | None = None) -> str:
    """The model's class and its parameters: those ``optimizer`` trains, when it holds others
    too (an EMA copy or a teacher beside the trained model in one module, frozen layers)."""
    if model is None:
        return "a model bsmon did not find (no nn.Module holds the optimizer's parameters)"
    count = sum(p.numel() for p in model.parameters())
    if optimizer is None:
        return f"{type(model).__name__} ({count:,} parameters)"
    wanted = {id(p) for group in optimizer.param_groups for p in group["params"]}
    trained = sum(p.numel() for p in model.parameters() if id(p) in wanted)
    if trained == count:
        return f"{type(model).__name__} ({count:,} parameters)"
    return (
        f"{type(model).__name__} ({trained:,} parameters trained; it holds {count - trained:,} "
        "more that the optimizer does not train: an EMA copy, a frozen part)"
    )


def describe_optimizer(optimizer: torch.optim.Optimizer | None) -> str:
    if optimizer is None:
        return "none"
    tensors = sum(len(group["params"]) for group in optimizer.param_groups)
    return f"{type(optimizer).__name__} over {tensors} tensors"
