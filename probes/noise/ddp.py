"""DDP: each rank's local gradient before the all-reduce against the all-reduced one.

bsmon registers a DDP communication hook (the official API, research note §8.3 and
factcheck §3). For every gradient bucket it takes the squared norm of the bucket as this rank
computed it (``bucket.buffer()`` before the all-reduce: the local gradient ``l``, summed over
any ``no_sync`` micro-steps), then hands the bucket to the real communication hook unchanged;
at the end of the backward pass, after DDP has written the averaged gradient ``ḡ`` into
``p.grad``, the squared norm of that (what the optimizer will see) is taken like every
source's. Nothing is measured on the communication's completion: a callback chained to its
future would need the interpreter lock on gloo's thread, which made measured steps wait (the
one the all-reduce needs to hand DDP a tensor, torch's hook has too). The local
batch of B_s examples is the small batch, the global batch of W·B_s the big one (eq. A.2),
estimated on every rank from its own gradients: no extra collective, so a rank that runs
without bsmon cannot be left waiting.

The rank's unit enters the estimator as ``|ḡ|² + |l − ḡ|²`` rather than ``|l|²``: they differ
by ``2ḡ·(l − ḡ)``, whose expectation is zero, but whose spread grows with the signal |G|² and
swamped the estimate (two ranks at the default budget read 23% low and 26% high after 3,000
steps; with two ranks, ``l − ḡ`` is the same on both up to sign, so this is exactly the
estimate pooled over the ranks). It needs a copy of the local bucket, kept from the hook to
the end of backward — one more gradient's worth of memory on measured steps, taken only while
the device has room for it (``COPY_ROOM``); otherwise that step uses ``|l|²``.

DDP allows one communication hook per model. bsmon's hook calls the *real* one: DDP's default
all-reduce, or the hook the user registers later — ``register_comm_hook`` and
``_register_builtin_comm_hook`` of that model are redirected to become the inner hook instead
of failing. A hook registered *before* ``attach()`` cannot be wrapped (DDP offers no way to
replace it); then this source is unavailable and ``auto`` falls back to per-example norms.
When the monitor closes, the hook stays (DDP cannot remove one) but only forwards.

The hook runs on every step, but only the steps the cost budget measures are looked at: the
controller arms the source at the boundary before each (as it does per-example norms), and on
the others the hook tests one flag and all-reduces the bucket as DDP does without a hook (no
call into the rest of bsmon, nothing allocated but the one-element list the process group
takes): an unmeasured step costs the training thread what an unsharded one does, and 6 calls
a bucket.

Nothing of bsmon's is left in the DDP model's own state (it deep-copies and pickles as
without bsmon): the hook lives in DDP's C++ reducer, which pickling leaves out, and the
redirection is made on the class, for the models bsmon watches, not on the instance.
"""

from __future__ import annotations

import functools
import time
import weakref
from collections.abc import Callable
from typing import Any

import psutil
import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from ..runtime.audience import examples_unknown
from .autograd import ExampleCounter, total_squared_norm
from .source import Source, hook
from .step_record import StepRecord

COPY_ROOM = 0.25  # the local copy may take at most this share of the device's free memory
ROOM_FRESH_S = 2.0  # free memory is read at most this often (a measured step asks each time)


class CommHookTaken(RuntimeError):
    """The DDP model already has a communication hook, registered before attach()."""


def _free_bytes(device: torch.device) -> int:
    """Memory a new tensor on ``device`` could take: free plus cached by the allocator."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return free + cached
    return psutil.virtual_memory().available


def _builtin_hooks() -> dict[Any, Callable]:
    kinds = dist.BuiltinCommHookType
    return {
        kinds.ALLREDUCE: default_hooks.allreduce_hook,
        kinds.FP16_COMPRESS: default_hooks.fp16_compress_hook,
    }


def _first_tensor(fut: torch.futures.Future[list[Tensor]]) -> Tensor:
    return fut.value()[0]


def bsmon_comm_hook(state: DDPSource, bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
    """The hook DDP calls per bucket; ``state`` is the source. On a measured step it measures
    the local bucket; on any step it hands the bucket, as it is, to the inner hook, or (none
    registered) all-reduces it as DDP's reducer does without a hook: divided by the ranks,
    then summed over them by the process group itself. Torch's Python ``allreduce_hook`` does
    the same through ``dist.all_reduce``'s checks and logger, 10 calls more a bucket on the
    training thread; the future's value must be a tensor (a Python hook's result is read as
    one), hence the callback. An unmeasured step costs 6 calls a bucket, this one's
    included (tests/processes/test_hot_path_sharded.py)."""
    if state.active:
        state.measure_local(bucket)
    inner = state.inner_hook
    if inner is not None:
        return inner(state.inner_state, bucket)
    buffer = bucket.buffer()
    buffer.div_(state.ranks)
    return state.group.allreduce([buffer]).get_future().then(_first_tensor)


# DDP checks the hook's annotations against the real types; `from __future__ import
# annotations` would leave strings there, so set them explicitly
bsmon_comm_hook.__annotations__ = {
    "state": "DDPSource",
    "bucket": dist.GradBucket,
    "return": torch.futures.Future[Tensor],
}


class _Redirects:
    """``register_comm_hook`` and ``_register_builtin_comm_hook`` of DDP, replaced on the
    class while bsmon watches a model: on a watched model they set the inner hook of bsmon's
    source; on any other they do what DDP does."""

    def __init__(self) -> None:
        self._sources: weakref.WeakKeyDictionary[Any, DDPSource] = weakref.WeakKeyDictionary()
        self._originals: dict[str, Callable] = {}
        self._cls: type | None = None

    def watch(self, ddp: Any, source: DDPSource) -> None:
        self._sources[ddp] = source
        if not self._originals:
            self._install(torch.nn.parallel.DistributedDataParallel)

    def unwatch(self, ddp: Any) -> None:
        self._sources.pop(ddp, None)
        if not self._sources:
            self._uninstall()

    def _install(self, cls: type) -> None:
        names = ("register_comm_hook", "_register_builtin_comm_hook")
        originals = {name: getattr(cls, name) for name in names}
        sources = self._sources

        @functools.wraps(originals["register_comm_hook"])
        def register_comm_hook(ddp: Any, state: object, hook: Callable) -> None:
            source = sources.get(ddp)
            if source is None:
                return originals["register_comm_hook"](ddp, state, hook)
            ddp._check_comm_hook(hook)
            source.set_inner(state, hook, getattr(hook, "__qualname__", repr(hook)))
            return None

        @functools.wraps(originals["_register_builtin_comm_hook"])
        def register_builtin_comm_hook(ddp: Any, comm_hook_type: Any) -> None:
            source = sources.get(ddp)
            if source is None:
                return originals["_register_builtin_comm_hook"](ddp, comm_hook_type)
            hook = _builtin_hooks().get(comm_hook_type)
            if hook is None:
                raise RuntimeError(f"bsmon cannot wrap the built-in comm hook {comm_hook_type}")
            source.set_inner(ddp.process_group, hook, str(comm_hook_type))
            return None

        cls.register_comm_hook = register_comm_hook  # type: ignore[method-assign]
        cls._register_builtin_comm_hook = register_builtin_comm_hook  # type: ignore[method-assign]
        self._originals = originals
        self._cls = cls

    def _uninstall(self) -> None:
        for name, original in self._originals.items():
            setattr(self._cls, name, original)
        self._originals = {}


_redirects = _Redirects()


def _pieces(flat: Tensor, params: list[Tensor]) -> list[Tensor]:
    """A bucket's flat values split into its parameters' (views, in bucket order)."""
    return list(torch.split(flat.reshape(-1), [p.numel() for p in params]))


class DDPSource(Source):
    estimator = "ddp"
    skips_unmeasured_steps = True

    def __init__(
        self,
        ddp: torch.nn.parallel.DistributedDataParallel,
        counter: ExampleCounter,
        examples_hint: Callable[[], int | None],
        **kwargs: Any,
    ) -> None:
        params = [p for p in ddp.parameters() if p.requires_grad]
        super().__init__(params, counter=counter, **kwargs)
        self._examples_hint = examples_hint
        self.group = ddp.process_group
        self.ranks = self.group.size()
        self.inner_state: Any = self.group
        # None: DDP's all-reduce, run by bsmon_comm_hook itself; torch's hook where
        # dist.all_reduce's handling of complex tensors is needed
        complex_params = any(p.is_complex() for p in params)
        self.inner_hook: Callable | None = default_hooks.allreduce_hook if complex_params else None
        self.inner_name = "DDP's all-reduce"
        try:
            ddp.register_comm_hook(self, bsmon_comm_hook)
        except RuntimeError as exc:
            raise CommHookTaken(str(exc)) from None
        hooks = getattr(ddp, "_comm_hooks", None)  # DDP's own copy, part of its pickled state
        if isinstance(hooks, list) and hooks and hooks[-1][1] is self:
            hooks.pop()
        self._ddp = ddp
        _redirects.watch(ddp, self)
        self._copy_bytes = sum(p.numel() * p.element_size() for p in params)
        self._room: tuple[float, int] | None = None  # (when read, free bytes)
        self._copies: list[tuple[Tensor, list[Tensor]]] = []  # this step's local buckets
        self._local: list[Tensor] = []  # this step's |l|² per bucket, when there is no copy
        self._deviations: list[Tensor] = []  # |l_k − ḡ_k|² of each all-reducing pass k
        self._pass_examples: list[float] = []  # this rank's examples of each all-reducing pass

    def set_inner(self, state: object, hook: Callable, name: str) -> None:
        """The communication hook bsmon's hook calls (a registration redirected here)."""
        self.inner_state, self.inner_hook, self.inner_name = state, hook, name

    # -- in the comm hook (autograd thread) ----------------------------------------------------

    @hook("DDP comm hook (local norm)")
    def measure_local(self, bucket: dist.GradBucket) -> None:
        buffer = bucket.buffer().detach()
        first = not self._copies and not self._local
        if self._copies or (first and self._room_for_a_copy(buffer.device)):
            self._copies.append((buffer.clone(), bucket.parameters()))
        else:
            params = bucket.parameters()
            self._local.append(self._squared(_pieces(buffer, params), params))
        self._end.touch()  # the averaged gradient is read once DDP has written it

    def _room_for_a_copy(self, device: torch.device) -> bool:
        now = time.monotonic()
        if self._room is None or now - self._room[0] > ROOM_FRESH_S:
            self._room = now, _free_bytes(device)
        return self._copy_bytes <= COPY_ROOM * self._room[1]

    def _squared(self, pieces: list[Tensor], params: list[Tensor]) -> Tensor:
        """Σ|piece|² of a bucket's pieces, weighted like |p.grad|² (Adam's preconditioner)."""
        w2 = [self.precond.w2(p) for p in params] if self.precond is not None else None
        if w2 is not None and any(w is None for w in w2):
            self._problem = "Adam state not initialised yet (first step)"
            w2 = None
        return total_squared_norm(pieces, w2)  # type: ignore[arg-type]

    def _on_backward_end(self) -> None:
        super()._on_backward_end()
        self._pass_examples.append(self.take_examples())
        if not self._copies:
            return
        deviations = []
        for copy, params in self._copies:
            pieces = _pieces(copy, params)  # views: l − ḡ is taken in place, in the copy
            pairs = [
                (x, p.grad.reshape(-1))
                for x, p in zip(pieces, params, strict=True)
                if p.grad is not None
            ]
            if pairs:
                torch._foreach_sub_([x for x, _ in pairs], [g for _, g in pairs])
            deviations.append(self._squared(pieces, params))
        self._copies = []
        self._deviations.append(torch.stack(deviations).sum())

    # -- step ----------------------------------------------------------------------------------

    def _record(self, step: int) -> StepRecord | None:
        if self._total is None:
            return None
        passes = self._pass_examples
        local = sum(passes) or self._examples_hint() or 0
        if not local:
            self._problem = f"unknown local batch size ({examples_unknown()})"
        if len(passes) > 1:  # accumulation without no_sync: each pass all-reduced
            return self._record_passes(step, passes)
        if self._deviations:
            unit = self._total + self._deviations[0].to(self._total.device)
        elif self._local:
            device = self._local[0].device
            unit = torch.stack([t.to(device) for t in self._local]).sum()
        else:
            return None
        world = self.world
        return self._make(
            step,
            [unit],
            examples=local * world,
            units=((1, float(local or 1), 1.0 / (world * world)),),
        )

    def _record_passes(self, step: int, passes: list[float]) -> StepRecord | None:
        """A step whose k backward passes each all-reduced (accumulation without
        ``no_sync``): pass k's deviation ``d_k = l_k − ḡ_k`` compares this rank's n_k
        examples with all ranks' W·n_k, so tr Σ ≈ |d_k|² / (q_k²·(1/n_k − 1/(W·n_k))), with
        q_k = W·n_k/N the pass's share of the step's N examples. Each pass is a unit of n_k
        examples whose |m_u|² is Y + A_k·|d_k|², A_k chosen so the estimator's unit term is
        exactly that (with one pass, A = 1: the unit above)."""
        if len(self._deviations) != len(passes):
            self._problem = (
                "gradient accumulation without no_sync needs a copy of the local gradient "
                "at every pass (no room on the device)"
            )
            return None
        if not all(passes):  # the job's batches are known, not counted: equal micro-batches
            local = self._examples_hint() or 0
            if not local:
                self._problem = f"unknown examples of a backward pass ({examples_unknown()})"
                return None
            passes = [local / len(passes)] * len(passes)
        world = self.world
        total_examples = world * sum(passes)
        device = self._total.device
        values, units = [], []
        for n, deviation in zip(passes, self._deviations, strict=True):
            share = world * n / total_examples
            weight = (1 / n - 1 / total_examples) / ((1 / n - 1 / (world * n)) * share * share)
            values.append(self._total + weight * deviation.to(device))
            units.append((1, float(n), (n / total_examples) ** 2))
        return self._make(step, values, examples=total_examples, units=tuple(units))

    def _clear(self) -> None:
        self.take_examples()
        self._copies, self._local, self._deviations, self._pass_examples = [], [], [], []

    def detail(self) -> str:
        return f"local vs all-reduced gradient, {self.world} ranks (around {self.inner_name})"

    def close(self) -> None:
        super().close()  # the hook stays registered (DDP cannot remove it) and only forwards
        _redirects.unwatch(self._ddp)
