"""Tokens per second and MFU in each metrics message.

The forward watch looks at one training call of the model on steps 2, 4, 8, ... 64 (it is
held for those steps alone, never on an ordinary one) and ``Look``, its input listener, notes
the call's shapes and precision; on any later step the hook is held (a step the noise scale
measures) it leaves the input's shape, which is compared with the first. Everything else is
the agent thread's: the FLOPs counted once on the meta device (``flops``), the device's peak
(``peak``), and each message's figures: its samples/s, exact per step whatever the batch size
does, times the tokens (or FLOPs) per example.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..runtime.context import JobContext
from ..runtime.forward_watch import ForwardWatch, RootPass, root_input
from ..runtime.service import Extension, MetricsPart
from ..wire import protocol
from ..wire.protocol import Event
from .flops import InputShapes, training_flops
from .peak import peak_flops

WAITING = "waiting to see a training step of the model"
NOT_TOKENS = (
    "the model's input is not token ids (an integer tensor of examples × sequence): "
    "its tokens are not counted"
)
_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass(frozen=True)
class Seen:
    """One training call, as the training thread noted it."""

    per_example: tuple[int, ...]  # the root input's shape without its batch dimension
    seq_len: int | None  # tokens per example (None: not token ids)
    call: InputShapes | None  # None: its examples were not counted
    dtype: str  # the matmuls' precision
    device: torch.device


def sequence_length(x: torch.Tensor | None, batch_dim: int) -> int | None:
    """The tokens per example of token ids ``x`` (examples × sequence, either way round):
    the dimension beside the batch dimension; None for any other input."""
    if x is None or x.is_floating_point() or x.is_complex() or x.dim() != 2:
        return None
    return int(x.shape[1 - batch_dim]) if batch_dim in (0, 1) else None


def per_example_shape(shape: tuple[int, ...], batch_dim: int) -> tuple[int, ...]:
    """An input's shape without its batch dimension: what one example is."""
    return tuple(shape[:batch_dim]) + tuple(shape[batch_dim + 1 :])


def matmul_dtype(parameter: torch.Tensor) -> str:
    """The precision the model's matmuls run in now (this thread's autocast, else the
    parameters' dtype; FP32 on a GPU that allows TF32 runs in TF32)."""
    device = parameter.device.type
    dtype = parameter.dtype
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
    if dtype == torch.float32:
        tf32 = device == "cuda" and torch.backends.cuda.matmul.allow_tf32
        return "tf32" if tf32 else "fp32"
    return _DTYPES.get(dtype, str(dtype).removeprefix("torch."))


class Look:
    """Training thread: what the forward watch's looks saw of a training call (its input
    listener, called on a few steps only, never an ordinary one)."""

    def __init__(self, watch: ForwardWatch, parameter: torch.Tensor | None) -> None:
        self._watch = watch
        self._parameter = parameter
        self.seen: deque[Seen] = deque(maxlen=8)  # taken by the agent thread
        if parameter is not None:
            watch.on_input(self._on_call)

    def close(self) -> None:
        self._watch.off_input(self._on_call)

    def batch_dim(self) -> int:
        watch = self._watch
        return watch.batch_dim if watch.batch_dim is not None else watch.learned_dim or 0

    def _on_call(self, root: RootPass, args: tuple, kwargs: dict) -> None:
        parameter, batch_dim = self._parameter, self.batch_dim()
        assert parameter is not None
        x = root_input(args, kwargs)
        per_example = per_example_shape(x.shape if x is not None else (), batch_dim)
        call = InputShapes.of(args, kwargs, root.examples) if root.examples else None
        seq_len = sequence_length(x, batch_dim)
        dtype = matmul_dtype(parameter)
        self.seen.append(Seen(per_example, seq_len, call, dtype, parameter.device))


class ThroughputExtension(Extension):
    """Agent thread: the message's ``throughput`` part from what the look saw."""

    def __init__(self, watch: ForwardWatch, model: nn.Module | None, ctx: JobContext) -> None:
        parameter = next(iter(model.parameters()), None) if model is not None else None
        self._ctx = ctx
        self._said: str | None = None  # the figures or reasons last said in an event
        self._failed: str | None = None  # why a failure of this part ended its figures
        self._model = model
        self._watch = watch
        self._look = Look(watch, parameter)
        self._first: Seen | None = None
        self._varies: str | None = None  # why the per-example figures do not hold
        self._flops: tuple[float | None, str | None] | None = None  # per example, or why not
        self._peak: tuple[float | None, str | None, str | None] | None = None  # + device name
        self.latest = protocol.ThroughputReading(tokens_note=WAITING, mfu_note=WAITING)

    def on_tick(self, _sample: Any) -> None:
        """The looks' calls, and the input of the latest training call the hook saw since:
        one that differs from the first look's ends the per-example figures."""
        seen = self._look.seen
        while seen:
            call = seen.popleft()
            if self._first is None:
                self._first = call
            self._compare(call.per_example)
        if (shape := self._watch.training_input) is not None and self._first is not None:
            self._compare(per_example_shape(shape, self._look.batch_dim()))

    def _compare(self, per_example: tuple[int, ...]) -> None:
        first = self._first
        if first is None or per_example == first.per_example or self._varies is not None:
            return
        self._varies = (
            f"the model's input varies in shape from batch to batch "
            f"({_shape(first.per_example)}, then {_shape(per_example)} per example)"
        )

    def metrics_part(self, metrics: protocol.Metrics) -> MetricsPart:
        """The reading; a failure of its own is reported once and leaves the rest of the
        message as it is (the reading then says why it has no figures)."""
        if self._failed is None:
            try:
                self.latest = self._reading(metrics)
                if self._first is not None:
                    self._say(self._first)
            except Exception as exc:
                self._ctx.guard.report("tokens/s and MFU", exc)
                self._failed = f"not measured: bsmon's own error ({type(exc).__name__})"
        if self._failed is not None:
            self.latest = protocol.ThroughputReading(
                tokens_note=self._failed, mfu_note=self._failed
            )
        return {"throughput": self.latest}

    def _say(self, first: Seen) -> None:
        """An event when the per-example figures (or their reasons) are first known, and
        again if they end: the Events panel and the record hold them, and the reasons the
        Batch panel leaves out."""
        peak, no_peak, device = self._peak_of(first)
        flops, why_not = self._flops_per_example(first) if peak else (None, None)
        if self._varies is not None:
            said = f"tokens and MFU n/a from now: {self._varies}"
        else:
            tokens = f"{first.seq_len:,} tokens per example" if first.seq_len else NOT_TOKENS
            counted = f"{_si(flops)}FLOP per example (meta device)" if flops else why_not
            mfu = f"MFU against {device} {first.dtype} ({_si(peak)}FLOP/s)"
            said = " · ".join(part for part in (tokens, counted, no_peak or mfu) if part)
        if said == self._said:
            return
        self._said = said
        data = {"seq_len": first.seq_len, "flops_per_sample": flops, "peak_flops_per_s": peak}
        data |= {"device": device, "dtype": first.dtype}
        self._ctx.emit(Event(time.time(), self._ctx.progress.step, "throughput", said, data=data))

    def _reading(self, metrics: protocol.Metrics) -> protocol.ThroughputReading:
        first = self._first
        if first is None:
            why = self._watch.blocked() or WAITING
            return protocol.ThroughputReading(tokens_note=why, mfu_note=why)
        rate, samples = metrics.samples_per_s, metrics.samples
        unknown = metrics.samples_note or "no samples per second yet"
        reading = protocol.ThroughputReading(seq_len=first.seq_len, dtype=first.dtype)
        if self._varies is not None:
            reading.tokens_note = reading.mfu_note = self._varies
            return reading
        if first.seq_len is None:
            reading.tokens_note = NOT_TOKENS
        elif rate is None:
            reading.tokens_note = unknown
        else:
            reading.tokens_per_s = rate * first.seq_len
            reading.tokens = samples * first.seq_len if samples is not None else None
        self._mfu(reading, first, rate, unknown)
        return reading

    def _mfu(
        self, reading: protocol.ThroughputReading, first: Seen, rate: float | None, unknown: str
    ) -> None:
        peak, no_peak, device = self._peak_of(first)
        per_example, why = self._flops_per_example(first) if peak else (None, None)
        reading.flops_per_sample = per_example
        reading.peak_flops_per_s, reading.device = peak, device
        if per_example is not None and rate is not None:
            reading.flops_per_s = rate * per_example
        if peak is not None and reading.flops_per_s is not None:
            reading.mfu = reading.flops_per_s / peak
        else:
            reading.mfu_note = no_peak or why or unknown

    def _flops_per_example(self, first: Seen) -> tuple[float | None, str | None]:
        """Counted once, and only where there is a peak to compare with: the count costs the
        job's host about a second the first time (torch imports dynamo for any dispatch
        mode), for nothing on a CPU."""
        if self._flops is None:
            if first.call is None or self._model is None:
                return None, "FLOPs not counted: the step's examples were not counted"
            self._flops = training_flops(self._model, first.call)
        return self._flops

    def _peak_of(self, first: Seen) -> tuple[float | None, str | None, str | None]:
        if self._peak is None:
            self._peak = _device_peak(first.device, first.dtype)
        return self._peak

    def stats(self) -> dict[str, Any]:
        """``mon.stats()``'s ``throughput``: the latest reading's fields."""
        return {name: getattr(self.latest, name) for name in self.latest.__struct_fields__}

    def detach(self) -> None:
        self._look.close()


def _device_peak(device: torch.device, dtype: str) -> tuple[float | None, str | None, str | None]:
    """The peak FLOP/s of the model's device for ``dtype``, or why there is none; its name."""
    if device.type != "cuda":
        return None, f"MFU n/a: the model runs on the {device.type.upper()} (no peak FLOP/s)", None
    try:
        name = torch.cuda.get_device_name(device)
    except Exception as exc:  # a device gone, a driver error: a state, not a crash
        return None, f"MFU n/a: the device's name could not be read ({exc})", None
    peak, why = peak_flops(name, dtype)
    return peak, (f"MFU n/a: {why}" if why else None), name


def _si(value: float | None) -> str:
    """FLOPs with an SI prefix: 762 G, 989 T."""
    value = value or 0.0
    for threshold, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= threshold:
            return f"{value / threshold:.3g} {prefix}"
    return f"{value:.3g} "


def _shape(per_example: tuple[int, ...]) -> str:
    return " × ".join(map(str, per_example)) or "a scalar"
