"""Everything bsmon does on the training thread at each optimizer step, and nothing more.

An ordinary step (the noise scale not measuring it, the step anatomy not sampling it) costs
the job exactly these Python calls, pinned by ``tests/unit/test_hot_path.py``:

- the optimizer's post-step hook (``HotPath._post_hook``): one ``time.perf_counter()``, and
  the step's end and batch size stored into its slot of preallocated lists
  (``inbox.StepRing``: no call, no object made that the agent thread must then read) — 2
  calls. That is all while ``progress.quiet`` (``runtime.progress``) says the step is an
  ordinary one and no boundary is due: the step's other fields keep the ring's defaults.
  A step with more to record (a batch drawn, an evaluation signal, a micro-batch, tensors
  handed back, a boundary) takes the full path (``_full_post_hook``: +2 calls), which
  tells at its end whether the next step is ordinary again;
- ``mon.log(loss=loss)`` (``Monitor.log``): one ``deque.append`` of the keyword dict — 2
  calls; on a loop logging faster than a dashboard shows, ``mon.log`` is the inbox's
  ``dict.update`` itself — 1 call (the values are read, checked and copied off a device on
  the agent thread).

Everything else happens on the agent thread (durations, wall-clock times, the samples and
batch size of each step, scalars, windows, the record) or on *scheduled* steps. The agent
thread reads the job's tensors without freeing them: it hands them back (``hand_back``) and
the next steps' ends drop them here, a few each, since a tensor's deallocation lets go of the
GIL (once a tick on a fast loop: the latest loss). A part that needs a step boundary asks
for it with ``wake(step)``: the post-hook of the first step at or after it runs
``on_boundary`` (the composition root's slow path: a pending batch-size change, the noise
scale's next measured step, the anatomy's next sampled step, DDP timing), which returns the
next step it needs. The tests on an ordinary step: one attribute, one integer comparison.

Under ``bsmon run`` the post-step hook is torch's global one (``every_optimizer``: the same
calls on an ordinary step), so the other optimizers' steps are seen too, and the hot path can
``follow`` another optimizer once the one it followed has stopped stepping.

The optimizer's pre-step hook is registered only while a step needs it (a step the noise scale
measures or the anatomy samples), or for good when the optimizer's class can nest ``step()``
calls: a subclass whose ``step`` calls ``super().step()`` fires torch's hooks twice per step
once an instance of the parent class exists, and a depth counter then counts each
user-level step once. Should a step raise, that counter would stay raised; a pre-hook that
finds it raised counts torch's step wrappers on the stack to tell a nested call from a stale
counter. Every exception is counted and reported (``FaultGuard``), never raised into the job.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from time import perf_counter
from typing import Any

import torch

from .fault_guard import FaultGuard
from .inbox import Inbox
from .progress import Progress

NEVER = sys.maxsize  # no boundary scheduled
FINISHED = NEVER + 1  # a part's boundary work is over for good: the boundary stops asking it


def _step_wrapper_code() -> Any:
    make = getattr(torch.optim.Optimizer, "profile_hook_step", None)
    if make is None:
        return None
    return make(lambda *args, **kwargs: None).__code__


_WRAPPER_CODE = _step_wrapper_code()


def steps_with_closure(args: tuple, kwargs: dict) -> bool:
    """Whether a step was given a closure (LBFGS and the like: the closure re-evaluates the
    model, several times per step for LBFGS). Step hooks get ``(optimizer, closure, ...)``:
    torch passes the wrapped method's arguments, ``self`` first."""
    positional = args[1:] if args and isinstance(args[0], torch.optim.Optimizer) else args
    closure = kwargs.get("closure", positional[0] if positional else None)
    return callable(closure)


def can_nest_steps(optimizer: torch.optim.Optimizer) -> bool:
    """Whether two classes of the optimizer's lineage define ``step`` (a subclass calling
    ``super().step()``): torch may then fire the hooks twice for one step."""
    base = torch.optim.Optimizer
    own = [c for c in type(optimizer).__mro__ if c is not base and "step" in c.__dict__]
    return len(own) > 1


def _wrapper_frames_on_stack() -> int:
    count = 0
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code is _WRAPPER_CODE:
            count += 1
        frame = frame.f_back
    return count


class StepWork:
    """What the training thread does on a step besides recording it; the composition root
    fills these in. All run on the training thread, inside the hot path's guard."""

    def __init__(self) -> None:
        # before the optimizer updates (non-closure steps) or after it (closure steps)
        self.noise_step: Callable[[], None] = lambda: None
        # the optimizer starting, on a sampled step (the anatomy's mark)
        self.optimizer_starting: Callable[[float], None] = lambda _now: None
        # the anatomy's marks of the sampled step that just ended
        self.take_marks: Callable[[float], Any] = lambda _now: None
        # the scheduled slow path: (step, now) -> the next step that needs it
        self.on_boundary: Callable[[int, float], int] = lambda _step, _now: NEVER


class HotPath:
    """The optimizer hooks and ``log``: records the step, defers the rest."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        inbox: Inbox,
        progress: Progress,
        guard: FaultGuard,
        work: StepWork,
        *,
        samples: Any,
        examples: Any,
        evals: Any,
        reevaluates: bool = False,
    ) -> None:
        self._optimizer = optimizer
        self._ring = inbox.ring
        self._inbox = inbox
        self._loss_sink = [inbox.losses.append]  # where backward()'s tensor goes: see below
        self._progress = progress
        self._guard = guard
        self._work = work
        self._samples = samples  # runtime.samples.StepSamples
        self._examples = examples  # noise.autograd.ExampleCounter of the model's inputs
        self._evals = evals  # runtime.evaluation.EvalClock
        self._reevaluates = reevaluates
        self.control: Any = None  # batch.control.BatchController, once made
        self.next_boundary = 0  # the first step's end runs the slow path
        self.noise_due = False  # the step in progress is one the noise scale measures
        self.sampling = False  # the step in progress is one the anatomy samples
        self.micro_batches = 0  # mon.should_step() calls since the last step
        self.declared = 0  # batch control's size (0: none) as of the last full step
        self.batches_since_step: list[Any] = []  # mon.dataloader batches of the step so far
        self.stale_recoveries = 0
        self._depth = 0
        self._nested = can_nest_steps(optimizer)
        self._pre_handle: Any = None
        self._handed_back: list[Any] = []  # the job's tensors, let go of a few a step
        self._release_per_step = 1
        self._post_handle = optimizer.register_step_post_hook(self._post_hook)
        # another optimizer's step, once the post-hook is torch's global one (every_optimizer)
        self._on_other: Callable[[Any, float], None] = lambda _optimizer, _end: None
        if self._nested:
            self._pre_handle = optimizer.register_step_pre_hook(self._nested_pre_hook)

    # -- scheduling (any thread) ---------------------------------------------------------------

    def wake(self, step: int = 0) -> None:
        """Run the slow path at the end of ``step`` (or the next step, if it is past)."""
        self.next_boundary = min(self.next_boundary, step)

    def hand_back(self, objects: list[Any], over_steps: int) -> None:
        """Agent thread: the job's tensors the agent has read (a tick's, ``over_steps`` steps'
        worth), dropped by the training thread a few at each step's end (no call: a test and
        a slice deleted), about as a bare job drops one loss a step. Freeing a tensor lets go
        of the GIL, so on the agent thread each one would be a hand-over the training thread
        waits for; and a tick's tensors freed at once overflow the allocator's per-thread
        cache, so the next step's allocations take its slow path (callgrind, tiny model:
        6,000 instructions a step, half of all that bsmon added)."""
        backlog = self._handed_back
        backlog += objects
        self._release_per_step = 1 + len(backlog) // max(over_steps, 1)
        self._progress.quiet = False  # after the tensors: see _settle

    def need_pre_hook(self, needed: bool) -> None:
        """Training thread, at a boundary: register the pre-hook for the next step, or not."""
        if self._nested or self._post_handle is None:
            return
        if needed and self._pre_handle is None:
            self._pre_handle = self._optimizer.register_step_pre_hook(self._pre_hook)
        elif not needed and self._pre_handle is not None:
            self._pre_handle.remove()
            self._pre_handle = None

    def every_optimizer(self, on_other: Callable[[Any, float], None]) -> None:
        """Training thread, outside torch's loop over the followed optimizer's post-hooks: the
        post-hook becomes torch's global one, the same call on an ordinary step; the followed
        optimizer's steps are recorded, another's go to ``on_other(optimizer, its end)``."""
        from torch.optim.optimizer import register_optimizer_step_post_hook

        if self._post_handle is None:
            return
        self._post_handle.remove()
        self._post_handle = register_optimizer_step_post_hook(self._post_hook)
        self._on_other = on_other

    def follow(self, optimizer: torch.optim.Optimizer, earlier: list[float]) -> None:
        """Training thread, in a global post-hook of ``optimizer``'s step: record its steps
        from this one on instead of the followed optimizer's; its steps before, which ended at
        ``earlier``, are recorded first (their ends and sizes: what an ordinary step records)."""
        if self._pre_handle is not None:
            self._pre_handle.remove()
            self._pre_handle = None
        self._optimizer = optimizer
        self._nested, self._depth = can_nest_steps(optimizer), 0
        if self._nested:
            self._pre_handle = optimizer.register_step_pre_hook(self._nested_pre_hook)
        else:
            self.need_pre_hook(self.noise_due or self.sampling)
        progress, ring = self._progress, self._ring
        for end in earlier:
            progress.step += 1
            slot = progress.step & ring.mask
            ring.ends[slot] = end
            ring.declared[slot] = self.declared
            ring.written = progress.step
        progress.quiet = False  # the step in progress takes the full path

    @property
    def pre_hook_registered(self) -> bool:
        return self._pre_handle is not None

    @property
    def installed(self) -> bool:
        return self._post_handle is not None

    def remove(self) -> None:
        for handle in (self._pre_handle, self._post_handle):
            if handle is not None:
                handle.remove()
        self._pre_handle = self._post_handle = None
        self.let_go()

    def let_go(self) -> None:
        """Drop every tensor handed back and not yet dropped (the job is done stepping)."""
        self._handed_back.clear()

    def loss_at_backward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """A ``Tensor.backward`` that appends the tensor to the inbox's losses and calls
        ``original``: the tensor stays referenced until the agent thread drains it (its saved
        activations are freed by the backward pass itself, unless ``retain_graph=True``).
        On a fast loop (``keep_latest_loss``) only the latest tensor is kept: a tick's tensors
        kept with their graphs cost a 150 µs step 7–8 µs (docs/benchmarks.md)."""
        sink = self._loss_sink

        @functools.wraps(original)
        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            sink[0](tensor)
            return original(tensor, *args, **kwargs)

        return backward

    def keep_latest_loss(self, latest_only: bool) -> None:
        """Any thread: backward()'s tensors all kept for the agent, or only the latest."""
        inbox = self._inbox
        self._loss_sink[0] = inbox.latest_loss.append if latest_only else inbox.losses.append

    # -- the hooks (training thread) ---------------------------------------------------------

    def _nested_pre_hook(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        try:
            if self._depth and _WRAPPER_CODE is not None and _wrapper_frames_on_stack() <= 1:
                self._depth = 0  # the previous step raised before its post-hook ran
                self.stale_recoveries += 1
            self._depth += 1
            if self._depth == 1:
                self._pre_hook(optimizer, args, kwargs)
        except Exception as exc:
            self._guard.report("optimizer pre-step hook", exc)

    def _pre_hook(self, _optimizer: Any, args: tuple, kwargs: dict) -> None:
        try:
            closure = (args[1:] or kwargs) and steps_with_closure(args, kwargs)
            if self.noise_due and not closure:
                self._work.noise_step()
            if self.sampling:
                self._work.optimizer_starting(perf_counter())
        except Exception as exc:
            self._guard.report("optimizer pre-step hook", exc)

    def _post_hook(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        if optimizer is not self._optimizer:  # torch's global post-hook: another optimizer
            self._other_step(optimizer, args, kwargs)
            return
        progress = self._progress
        if progress.quiet:  # an ordinary step: its end and batch size, nothing else
            step = progress.step + 1
            if step < self.next_boundary:
                try:
                    progress.step = step
                    ring = self._ring
                    slot = step & ring.mask
                    ring.ends[slot] = perf_counter()
                    ring.declared[slot] = self.declared
                    ring.written = step
                except Exception as exc:
                    self._guard.report("optimizer post-step hook", exc)
                return
        self._full_post_hook(optimizer, args, kwargs)

    def _other_step(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        try:
            self._on_other(optimizer, perf_counter())
        except Exception as exc:
            self._guard.report("another optimizer's post-step hook", exc)
        if optimizer is self._optimizer:  # followed from this step on (follow)
            self._full_post_hook(optimizer, args, kwargs)

    def _full_post_hook(self, _optimizer: Any, args: tuple, kwargs: dict) -> None:
        """A step with more to record than its end (or the first, or a boundary)."""
        try:
            if self._nested:
                self._depth -= 1
                if self._depth > 0:
                    return
                self._depth = 0
            if self.noise_due and (args[1:] or kwargs) and steps_with_closure(args, kwargs):
                self._work.noise_step()  # a closure ran its backward pass inside the step
            progress = self._progress
            step = progress.step + 1
            progress.step = step
            now = perf_counter()
            ring = self._ring
            slot = step & ring.mask
            ring.ends[slot] = now
            samples = self._samples  # a field left alone holds its default (StepRing)
            if samples.drawing:
                ring.drawn[slot], ring.first_batch[slot] = samples.take()
            else:
                samples.passes_known = False
            counter = self._examples
            if counter.wanted:
                ring.examples[slot] = counter.take(self._reevaluates)
            control = self.control
            ring.declared[slot] = control.size if control is not None else 0
            evals = self._evals
            if evals.pending:
                ring.eval_s[slot] = evals.take(now)
            if self.sampling:
                ring.marks.append((step, self._work.take_marks(now)))
            ring.written = step
            self.micro_batches = 0
            if self.batches_since_step:
                self.batches_since_step = []
            handed = self._handed_back
            if handed:
                del handed[-self._release_per_step :]
            if step >= self.next_boundary:
                self._boundary(step, now)
            self._settle(progress)
        except Exception as exc:
            self._progress.quiet = False
            self._guard.report("optimizer post-step hook", exc)

    def _settle(self, progress: Progress) -> None:
        """At the end of a full step: whether the next one is ordinary, and its batch size.
        ``quiet`` is set before the test: the agent thread hands tensors back (then clears
        it) at any moment, and must find it cleared or its tensors seen."""
        control = self.control
        self.declared = control.size if control is not None else 0
        progress.quiet = True
        samples, evals = self._samples, self._evals
        if (
            self._nested
            or self.noise_due
            or self.sampling
            or samples.drawing
            or samples.passes_known
            or self._examples.wanted
            or evals.pending
            or self.micro_batches
            or self.batches_since_step
            or self._handed_back
        ):
            progress.quiet = False

    def _boundary(self, step: int, now: float) -> None:
        self.next_boundary = NEVER
        following = self._work.on_boundary(step, now)
        self.wake(following)  # a wake() from another thread in between stays in force
