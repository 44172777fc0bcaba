"""The forward passes of the user's model, seen without storing anything on the model.

bsmon needs three things from the forward pass: how many examples each pass of the model
carried (its batch dimension), the inputs and outputs of the layers it measures per example,
and the autocast precision the job runs in. Hooks registered on the model's modules would be
part of the model: ``copy.deepcopy``, ``pickle`` and ``torch.save`` of the whole model would
copy them (and fail on what they hold, or need bsmon to load the file). So this module uses
PyTorch's *global* module hooks instead, which live in ``torch.nn.modules.module`` and never
on a module, and filters the calls by module identity.

A global hook puts every module call in the process on PyTorch's slower call path (about a
microsecond each), so it is registered only while a holder needs it — a measured step, or a
job whose examples nothing else counts — and removed as soon as none does.

``torch.compile``: a compiled model must never meet bsmon's hooks — a global hook would be
traced into the graph (or make it recompile) and PyTorch warns about it. Once dynamo has
compiled anything in the process, the global hook is never registered again; a compiled
model passed to ``attach`` (an ``OptimizedModule``) is watched through a hook on that wrapper
alone, which dynamo never traces and which the wrapper's pickling leaves out.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch
from torch import nn

from . import audience
from .fault_guard import FaultGuard
from .hot_path import NEVER
from .layer_inputs import FirstLayer, first_layer, flat_input_examples

RECENT_PASSES = 64  # root passes kept for the layer calls whose gradients are still to come
LOOK = "look"  # the holder of a step whose training call the input listeners read
LAST_LOOK = 64  # the looks: at steps 2, 4, 8, ... up to this one (a later one would be a
# step dearer than its neighbours in a job with nothing else sampled: test_hot_path)
LayerCall = Callable[[nn.Module, tuple, Any, int], None]  # (module, args, output, pass id)
RootListener = Callable[["RootPass", Any], None]  # (the pass, the model's output)
InputListener = Callable[["RootPass", tuple, dict], None]  # (the pass, its args, its kwargs)

_SEQUENCE_FIRST = (
    nn.RNNBase,
    nn.MultiheadAttention,
    nn.TransformerEncoderLayer,
    nn.TransformerDecoderLayer,
    nn.Transformer,
)


class RootPass(NamedTuple):
    """One call of the model: examples along its batch dimension (None: not known)."""

    examples: int | None
    grad: bool
    training: bool
    index_dims: int | None = None  # dims of an integer input (token ids), None for floats


def compile_in_use() -> str | None:
    """Why bsmon must not register global module hooks now: torch.compile has compiled
    something in this process (its counters say so). None when it has not."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return None
    frames = counters.get("frames", {}).get("total", 0) if hasattr(counters, "get") else 0
    if frames:
        return "torch.compile is in use in this job"
    return None


def compiled_wrapper(model: nn.Module | None) -> bool:
    """Whether ``model`` is the wrapper ``torch.compile(model)`` returns."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    wrapper = getattr(eval_frame, "OptimizedModule", None)
    return wrapper is not None and isinstance(model, wrapper)


def compiled_in_place(model: nn.Module | None) -> bool:
    """Whether ``model`` or one of its modules was compiled with ``Module.compile()``."""
    if model is None:
        return False
    return any(getattr(m, "_compiled_call_impl", None) is not None for m in model.modules())


def sequence_first(module: nn.Module) -> bool:
    """A module that takes (sequence, batch, ...) inputs: an RNN, attention or transformer
    layer built with ``batch_first=False``."""
    return isinstance(module, _SEQUENCE_FIRST) and not getattr(module, "batch_first", False)


def first_tensor(value: Any) -> torch.Tensor | None:
    """The first tensor in a (nested) argument: a tensor, a tuple/list or a dict of them."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, dict):
        value = value.values()
    if isinstance(value, (list, tuple, type({}.values()))):
        for item in value:
            if (found := first_tensor(item)) is not None:
                return found
    return None


def root_input(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The model call's input whose batch dimension holds its examples: the first positional
    tensor, else the first tensor among the arguments, else among the keyword arguments."""
    x = args[0] if args and isinstance(args[0], torch.Tensor) else first_tensor(args)
    return x if x is not None else first_tensor(kwargs)


class ForwardWatch:
    """Sees the calls of one model (its *root passes*) and of the layers registered with
    ``watch_layer``.

    Training thread only. ``hold(who)`` registers the hook (if it may be), ``release(who)``
    removes it once nobody holds it. Nothing is registered before ``arm()``, which the
    monitor calls once the job's first step is over: by then a model compiled after
    ``attach`` has run once, and torch.compile's use is known.
    """

    def __init__(
        self, model: nn.Module | None, guard: FaultGuard, batch_dim: int | None = None
    ) -> None:
        self.model = model
        self.guard = guard
        self.batch_dim = batch_dim  # given by the user: the root input's batch dimension
        self.learned_dim: int | None = None  # seen: where a sequence-first layer's batch was
        self._layers: dict[int, LayerCall] = {}
        self._sequence_first = {
            id(m): m for m in (model.modules() if model is not None else ()) if sequence_first(m)
        }
        self._holders: set[str] = set()
        self._handle: Any = None
        self._listeners: list[RootListener] = []
        self._input_listeners: list[InputListener] = []
        self._look_at = NEVER  # the next step whose first training call they read
        # the latest training call's input shape, on any step the hook was held (no call)
        self.training_input: torch.Size | None = None
        self._looking = False  # held for this step's call
        self._look_read = False  # this step's call was read
        self.armed = False
        self._suspended = False
        self.pass_id = 0  # counts root passes; layer calls carry the id of the pass in progress
        self._recent: dict[int, RootPass] = {}  # pass id -> pass, the last few
        self._pending_batch: int | None = None  # a sequence-first layer's batch in this pass
        self.wrapper = compiled_wrapper(model)
        self.refusal: str | None = None
        self.uncounted: str | None = None  # why a pass's examples could not be counted
        if model is None:
            self.refusal = audience.say(
                attach="no model was given to attach()",
                run="bsmon run found no module that holds the optimizer's parameters",
            )
        elif compiled_in_place(model):
            self.refusal = "the model was compiled with Module.compile()"

    @functools.cached_property
    def first_layer(self) -> FirstLayer:
        """The model's first layer of a known kind: it says whether a 1-D input is a batch."""
        return first_layer(self.model) if self.model is not None else None

    # -- registration ---------------------------------------------------------------------------

    @property
    def installed(self) -> bool:
        return self._handle is not None

    def blocked(self) -> str | None:
        """Why the hook cannot be registered now (None: it can)."""
        if self.refusal is not None:
            return self.refusal
        if not self.wrapper and (reason := compile_in_use()) is not None:
            self.refusal = reason
            return reason
        return None

    def at_boundary(self, step: int, _now: float) -> int:
        """The scheduled boundary: armed again if a pass left it disarmed; a look begun or
        ended (no call on the boundaries between)."""
        if not self.armed:
            self.arm()
        if step + 1 < self._look_at:
            return self._look_at - 1 if self._look_at != NEVER else NEVER
        return self._look(step)

    def _look(self, step: int) -> int:
        """Hold for step + 1 (the input listeners read its first training call), or release
        at its end; the next boundary a look needs."""
        if self._looking:
            self._looking = False
            self.release(LOOK)
            self._look_at = step * 2 if step * 2 <= LAST_LOOK else NEVER
            return self._look_at - 1 if self._look_at != NEVER else NEVER
        if not self.hold(LOOK):
            self._look_at = NEVER  # blocked() says why
            return NEVER
        self._looking, self._look_read = True, False
        return step + 1

    def arm(self) -> None:
        """From now on a hold registers the hook (the holds made before take effect now)."""
        self.armed = True
        if self._holders and not self._install():
            self._holders.clear()

    def hold(self, who: str) -> bool:
        """Register the hook for ``who``; False (and nothing registered) when it may not be.
        Before ``arm()`` the hold is remembered and True is returned."""
        self._holders.add(who)
        if not self.armed:
            return self.blocked() is None
        if self._install():
            return True
        self._holders.clear()
        return False

    def _install(self) -> bool:
        if self.blocked() is not None:
            self._remove()
            return False
        if self._handle is None and not self._suspended:
            self._handle = self._register()
        return True

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """No hook registered while inside, the holds kept: for a benchmark that interleaves
        several watched models in one process, so that one's global hook does not slow the
        others' steps."""
        self._suspended = True
        self._remove()
        try:
            yield
        finally:
            self._suspended = False
            if self._holders and self.armed:
                self._install()

    def release(self, who: str) -> None:
        self._holders.discard(who)
        if not self._holders:
            self._remove()

    def close(self) -> None:
        self._holders.clear()
        self._remove()
        self._layers.clear()
        self._listeners.clear()
        self._input_listeners.clear()

    def _register(self) -> Any:
        if self.wrapper:  # dynamo never traces a hook on the wrapper itself
            assert self.model is not None
            return self.model.register_forward_hook(self._on_wrapper, with_kwargs=True)
        register = nn.modules.module.register_module_forward_hook
        try:
            return register(self._on_call, with_kwargs=True)
        except TypeError:  # a torch whose global hooks take no keyword arguments
            return register(self._on_call_positional)

    def _remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    # -- subscriptions --------------------------------------------------------------------------

    def watch_layer(self, module: nn.Module, call: LayerCall) -> None:
        self._layers[id(module)] = call

    def unwatch_layer(self, module: nn.Module) -> None:
        self._layers.pop(id(module), None)

    def on_root(self, listener: RootListener) -> None:
        """Call ``listener(root_pass, output)`` after each call of the model (while held)."""
        self._listeners.append(listener)

    def off_root(self, listener: RootListener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def on_input(self, listener: InputListener) -> None:
        """Call ``listener(root_pass, args, kwargs)`` with the first training call (gradients
        on, the model in ``train()``) of steps 2, 4, 8, ... ``LAST_LOOK``: the hook is held
        for those steps alone. The arguments are to be read there, never kept; later calls
        leave their input's shape in ``training_input`` whenever the hook is held."""
        self._input_listeners.append(listener)
        self._look_at = min(self._look_at, 2)

    def off_input(self, listener: InputListener) -> None:
        if listener in self._input_listeners:
            self._input_listeners.remove(listener)

    def pass_of(self, pass_id: int) -> RootPass | None:
        """The root pass a layer call with ``pass_id`` belonged to (None: the model's own
        forward was not called around it, or has not returned yet)."""
        return self._recent.get(pass_id)

    # -- the hook (training thread) -------------------------------------------------------------

    def _on_call_positional(self, module: nn.Module, args: tuple, output: Any) -> None:
        self._on_call(module, args, {}, output)

    def _on_call(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        try:
            key = id(module)
            call = self._layers.get(key)
            if call is not None:  # before the root's own pass ends: a model can be one layer
                call(module, args, output, self.pass_id)
            if key in self._sequence_first and args and isinstance(args[0], torch.Tensor):
                x = args[0]
                if x.dim() >= 2:
                    self._pending_batch = int(x.shape[1])
            if module is self.model:
                self._root_pass(args, kwargs, output)
        except Exception as exc:
            self.guard.report("forward hook", exc)

    def _on_wrapper(self, _module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        try:
            self._root_pass(args, kwargs, output)
        except Exception as exc:
            self.guard.report("forward hook", exc)

    def _root_pass(self, args: tuple, kwargs: dict, output: Any) -> None:
        model = self.model
        assert model is not None
        # root_input's, written out: a call less on every watched pass (test_hot_path)
        x = args[0] if args and isinstance(args[0], torch.Tensor) else first_tensor(args)
        if x is None:
            x = first_tensor(kwargs)
        examples = self._examples_of(x)
        index_dims = x.dim() if x is not None and not x.is_floating_point() else None
        root_pass = RootPass(examples, torch.is_grad_enabled(), model.training, index_dims)
        self._recent[self.pass_id] = root_pass
        self._recent.pop(self.pass_id - RECENT_PASSES, None)
        self.pass_id += 1
        self._pending_batch = None
        for listener in self._listeners:
            listener(root_pass, output)
        if x is not None and root_pass.grad and root_pass.training:
            self.training_input = x.shape
            if self._looking and not self._look_read:
                self._look_read = True
                for read in self._input_listeners:
                    read(root_pass, args, kwargs)

    def _examples_of(self, x: torch.Tensor | None) -> int | None:
        """The examples in the root input ``x``: along ``batch_dim`` when the user gave it;
        else where a sequence-first layer of this pass found its batch (dim 1 of its input);
        else along dim 0 of an input of two dims or more. A 0- or 1-D input is judged by the
        model's first layer, the rule the noise scale applies to each layer's input
        (``layer_inputs``); when that cannot say, None and ``uncounted`` says why."""
        seen = self._pending_batch
        if x is None:
            return seen
        dim = self.batch_dim
        if dim is None and seen is not None:
            dims = [d for d in range(min(x.dim(), 2)) if x.shape[d] == seen]
            if dims:
                dim = 1 if 1 in dims else dims[0]
                self.learned_dim = dim
        if dim is None:
            if self.learned_dim is None and x.dim() < 2 and self.model is not None:
                examples, self.uncounted = flat_input_examples(self.first_layer, x)
                return examples
            dim = self.learned_dim if self.learned_dim is not None else 0
        return int(x.shape[dim]) if x.dim() > dim else None
