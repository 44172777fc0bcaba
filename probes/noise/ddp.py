"""DDP: each rank's local gradient before the all-reduce against the all-reduced one.

bsmon registers a DDP communication hook (the official API, research note §8.3 and
factcheck §3). For every gradient bucket it takes the squared norm of the bucket as this rank
computed it (``bucket.buffer()`` before the all-reduce: the local gradient, summed over any
``no_sync`` micro-steps), then hands the bucket to the real communication hook unchanged; at
the end of the backward pass, after DDP has written the averaged gradient into ``p.grad``,
the squared norm of that (what the optimizer will see) is taken like every source's. No
Python runs on the communication's completion: a callback chained to its future would need
the interpreter lock on gloo's thread, which made measured steps wait. The local batch of
B_s examples is the small batch, the global batch of W·B_s the big one (eq. A.2), estimated
on every rank from its own local norm: no extra collective, so a rank that runs without
bsmon cannot be left waiting.

DDP allows one communication hook per model. bsmon's hook calls the *real* one: DDP's default
all-reduce, or the hook the user registers later — ``register_comm_hook`` and
``_register_builtin_comm_hook`` of that model are redirected to become the inner hook instead
of failing. A hook registered *before* ``attach()`` cannot be wrapped (DDP offers no way to
replace it); then this source is unavailable and ``auto`` falls back to per-example norms.
When the monitor closes, the hook stays (DDP cannot remove one) but only forwards.

Nothing of bsmon's is left in the DDP model's own state (it deep-copies and pickles as
without bsmon): the hook lives in DDP's C++ reducer, which pickling leaves out, and the
redirection is made on the class, for the models bsmon watches, not on the instance.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from .autograd import ExampleCounter
from .record import StepRecord
from .source import Source, hook


class CommHookTaken(RuntimeError):
    """The DDP model already has a communication hook, registered before attach()."""


def _builtin_hooks() -> dict[Any, Callable]:
    kinds = dist.BuiltinCommHookType
    return {
        kinds.ALLREDUCE: default_hooks.allreduce_hook,
        kinds.FP16_COMPRESS: default_hooks.fp16_compress_hook,
    }


def bsmon_comm_hook(state: DDPSource, bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
    """The hook DDP calls per bucket; ``state`` is the source. Measures the local bucket, then
    hands it to the inner hook as it is."""
    state.measure_local(bucket)
    return state.inner_hook(state.inner_state, bucket)


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


class DDPSource(Source):
    estimator = "ddp"

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
        self.inner_state: Any = ddp.process_group
        self.inner_hook: Callable = default_hooks.allreduce_hook
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
        self._local: list[Tensor] = []  # this step's local bucket norms

    def set_inner(self, state: object, hook: Callable, name: str) -> None:
        """The communication hook bsmon's hook calls (a registration redirected here)."""
        self.inner_state, self.inner_hook, self.inner_name = state, hook, name

    # -- in the comm hook (autograd thread) ----------------------------------------------------

    @hook("DDP comm hook (local norm)")
    def measure_local(self, bucket: dist.GradBucket) -> None:
        self._local.append(self._bucket_sq(bucket, [bucket.buffer()]))
        self._end.touch()  # the averaged |p.grad|² is taken once DDP has written it

    def _bucket_sq(self, bucket: dist.GradBucket, flat: list[Tensor]) -> Tensor:
        data = flat[0].detach()
        if self.precond is None:
            return data.float().square().sum()
        params = bucket.parameters()
        pieces = torch.split(data.reshape(-1), [p.numel() for p in params])
        total = data.new_zeros((), dtype=torch.float32)
        for piece, param in zip(pieces, params, strict=True):
            w2 = self.precond.w2(param)
            if w2 is None:
                self._problem = "Adam state not initialised yet (first step)"
                continue
            total = total + (piece.float().square() * w2.reshape(-1)).sum()
        return total

    # -- step ----------------------------------------------------------------------------------

    def _record(self, step: int) -> StepRecord | None:
        if not self._local or self._total is None:
            return None
        device = self._local[0].device
        local = torch.stack([t.to(device) for t in self._local]).sum()
        examples = self.take_examples() or self._examples_hint() or 0
        if not examples:
            self._problem = "unknown local batch size (pass batch_size= to attach)"
        world = self.world
        return self._make(
            step,
            [local],
            examples=examples * world,
            units=((1, float(examples or 1), 1.0 / (world * world)),),
        )

    def _clear(self) -> None:
        self.take_examples()
        self._local = []

    def detail(self) -> str:
        return f"local vs all-reduced gradient, {self.world} ranks (around {self.inner_name})"

    def close(self) -> None:
        super().close()  # the hook stays registered (DDP cannot remove it) and only forwards
        _redirects.unwatch(self._ddp)
