"""The session record, format version 1: JSON Lines, one object per line, each with a ``type``.

A record is what the agent writes to disk for every session (docs/record.md describes it for
people; this module is the single source of truth for the shapes, but for a span's
``phases``, the step anatomy's ``anatomy.seconds.PhaseTotals``). The first line is a
``record`` header; then ``span`` lines (metrics aggregated over about half a second, merged
into coarser spans as they age), ``event`` lines (the wire protocol's events, verbatim),
``status`` lines (when what the job can measure changes), ``probe`` lines (probe results) and,
when the job closed cleanly, one ``end`` line. Readers ignore line types they do not know.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..anatomy.seconds import PhaseTotals
from ..wire.protocol import PROTOCOL_VERSION, Capability, Event, SessionInfo

RECORD_FORMAT = "bsmon-record"
RECORD_VERSION = 1
BUCKET_S = 0.5  # one base span covers this much wall time
PER_LEVEL = 1800  # spans kept at each resolution before pairs merge into the next one


class Stat(msgspec.Struct, array_like=True):
    """``[n, min, mean, max]`` of ``n`` values; merges exactly."""

    n: int
    min: float
    mean: float
    max: float


class RecordLine(msgspec.Struct, tag_field="type", omit_defaults=True):
    """Base of the record's own line types (``event`` lines are ``protocol.Event``)."""


class Header(RecordLine, tag="record"):
    format: str
    version: int
    created: float
    session: SessionInfo
    protocol: int = PROTOCOL_VERSION
    batch_size: int | None = None
    bucket_s: float = BUCKET_S
    per_level: int = PER_LEVEL
    capabilities: dict[str, Capability] = msgspec.field(default_factory=dict)


class Status(RecordLine, tag="status"):
    """What the job can measure, written at the start and whenever it changes."""

    t: float
    gpu: Capability
    noise_scale: Capability


class DeviceSpan(msgspec.Struct, omit_defaults=True):
    """One accelerator over a span: readings sampled about once a second."""

    index: int
    name: str = ""
    util: Stat | None = None  # percent
    util_hist: dict[int, int] = msgspec.field(default_factory=dict)  # whole percent -> samples
    mem_used: Stat | None = None  # bytes (NVML)
    mem_total: int | None = None
    torch_peak: int | None = None  # the torch allocator's peak, bytes
    torch_allocated: Stat | None = None  # bytes the torch allocator holds for tensors
    torch_reserved: int | None = None  # the most bytes the torch allocator reserved
    torch_reserved_peak: int | None = None  # its own peak (max_memory_reserved), bytes
    alloc_retries: int | None = None  # the allocator's cudaMalloc retries so far
    ooms: int | None = None  # the allocator's out-of-memory errors so far
    temperature: Stat | None = None  # °C
    power: Stat | None = None  # W
    error: str | None = None  # why a reading is missing (the latest reason)


class HostSpan(msgspec.Struct, omit_defaults=True):
    cpu: Stat | None = None  # percent of one core
    rss: Stat | None = None  # bytes


class Span(RecordLine, tag="span"):
    """Metrics over the wall-clock interval [t0, t1]; ``n`` base spans merged."""

    t0: float
    t1: float
    step: int  # the last step counted in the span (the step count at its end)
    n: int = 1
    steps: int = 0  # steps completed in the span
    samples: int = 0  # samples seen since the start, at the end of the span
    batch_size: int | None = None  # one batch size per span: a change closes the span
    # batch_size None because the examples per step varied: their least and most
    batch_range: list[int] | None = None
    timed_steps: int = 0
    timed_s: float = 0.0  # the summed durations of the timed steps
    timed_samples: int = 0  # the samples of the timed steps
    uncounted_s: float = 0.0  # the part of timed_s whose steps' samples were not counted
    eval_s: float = 0.0  # evaluation inside the training loop, not in any step's time
    step_time: Stat | None = None  # seconds, over individual steps
    step_hist: dict[int, int] = msgspec.field(default_factory=dict)  # log bin -> steps
    throughput: Stat | None = None  # samples/s, over base spans
    scalars: dict[str, Stat] = msgspec.field(default_factory=dict)
    first: dict[str, float] = msgspec.field(default_factory=dict)  # a scalar's first value
    b_simple: Stat | None = None
    b_simple_at_least: float | None = None  # no estimate yet: B_simple is at least this
    noise_steps: int | None = None  # steps the noise scale has measured and used so far
    phases: PhaseTotals | None = None  # where the timed steps' time went
    devices: list[DeviceSpan] = msgspec.field(default_factory=list)
    host: HostSpan | None = None
    # a sequence model's tokens trained so far, at the end of the span (samples × their
    # sequence length), and its model FLOPs utilization (a fraction), where they are known
    tokens: int | None = None
    mfu: Stat | None = None


class ProbeLine(RecordLine, tag="probe"):
    """The result of a batch-size probe, as the probe reports it."""

    t: float
    step: int
    result: dict[str, Any] = msgspec.field(default_factory=dict)


class End(RecordLine, tag="end"):
    """The job closed its monitor: nothing follows."""

    t: float
    reason: str
    step: int
    samples: int
    last: dict[str, float] = msgspec.field(default_factory=dict)  # each scalar's last value
    # the recording had stopped before (a full or read-only disk), and why: the spans end there
    recording_stopped: str | None = None


def throughput(timed_samples: int, timed_s: float, uncounted_s: float = 0.0) -> float | None:
    """Samples per second over the timed steps whose samples were counted (None: none)."""
    counted_s = timed_s - uncounted_s
    return timed_samples / counted_s if counted_s > 0 else None


def span_throughput(span: Span) -> float | None:
    return throughput(span.timed_samples, span.timed_s, span.uncounted_s)


Line = Header | Status | Span | Event | ProbeLine | End
KNOWN_TYPES = frozenset(("record", "status", "span", "event", "probe", "end"))

_encoder = msgspec.json.Encoder()
line_decoder = msgspec.json.Decoder(Line)


def encode_line(line: msgspec.Struct) -> bytes:
    """One record line, newline included."""
    return _encoder.encode(line) + b"\n"


def header_for(session: SessionInfo, batch_size: int | None, created: float) -> Header:
    return Header(
        format=RECORD_FORMAT,
        version=RECORD_VERSION,
        created=created,
        session=session,
        batch_size=batch_size,
    )
