"""The bsmon wire protocol, version 1: newline-delimited JSON over a Unix socket.

Every message is one UTF-8 JSON object on one line with a ``type`` field. The server
(the agent inside the training job) sends ``hello``, ``history``, ``metrics``, ``event``,
``reply``, ``notice`` and ``bye``; a client sends commands, each with an ``id`` that its
``reply`` echoes. docs/protocol.md describes every message; this module is the single
source of truth for their shapes.

Why one module: a client's author (or a test outside the project) reads the whole protocol in
one file, in the order docs/protocol.md gives it.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, get_args, get_origin

import msgspec

PROTOCOL_VERSION = 1
MAX_LINE_BYTES = 1 << 20  # a longer line from a client closes that connection
MAX_BATCH_SIZE = 1 << 31  # far above any real batch; a bigger value is a typo or an attack
# A string a client sends (a command's ``id`` or ``reason``) is kept: in replies, events, the
# record and every new client's greeting. Longer ones are refused, so a client cannot grow them.
MAX_TEXT_CHARS = 200
ECHO_CHARS = 40  # what a reply quotes of a value it refuses

CommandId = int | str | None


class Message(msgspec.Struct, tag_field="type", omit_defaults=False):
    """Base of every message on the wire; the subclass tag is the ``type`` field."""


# --------------------------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------------------------


class SessionInfo(msgspec.Struct):
    name: str
    pid: int
    host: str
    argv: list[str]
    start_time: float
    python: str
    torch_version: str
    bsmon_version: str
    cwd: str = ""
    rank: int = 0
    world_size: int = 1
    record: str | None = None  # the session record the job writes (docs/record.md), if any
    # a distributed job's model is (or holds) a DistributedDataParallel; None: one process,
    # or not known
    ddp: bool | None = None
    # a distributed job's model is sharded by FSDP2's fully_shard; None: not known (a record
    # from before it was kept), or one process
    fsdp2: bool | None = None
    zero_code: bool = False  # attached by `bsmon run`: the loss is what backward() is called on


class Capability(msgspec.Struct):
    """Whether a command or feature works in this job, and why not when it does not."""

    available: bool
    reason: str | None = None


class DeviceReading(msgspec.Struct, omit_defaults=True):
    """One accelerator as the job sees it. ``None`` means "n/a"; ``error`` says why."""

    index: int
    name: str = ""
    uuid: str = ""
    util_percent: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    torch_allocated_bytes: int | None = None
    torch_reserved_bytes: int | None = None
    torch_peak_bytes: int | None = None
    # the allocator's peak reserved bytes (max_memory_reserved; reset with the peak at each
    # batch change, like torch_peak_bytes)
    torch_reserved_peak_bytes: int | None = None
    # cudaMalloc calls that failed and succeeded after the allocator freed its cache, and
    # out-of-memory errors raised; counted since the job started (torch.cuda.memory_stats)
    alloc_retries: int | None = None
    ooms: int | None = None
    error: str | None = None
    # NVML's reasons the clocks are held down now, in words ("power cap, thermal"); None when
    # they are not (or NVML cannot say), and the SM clock they are at
    throttled: str | None = None
    sm_clock_mhz: float | None = None


class HostReading(msgspec.Struct, omit_defaults=True):
    cpu_percent: float | None = None
    rss_bytes: int | None = None
    threads: int | None = None
    error: str | None = None


Verdict = Literal["input-bound", "compute-bound", "communication-bound", "host-bound"]


class StepAnatomy(msgspec.Struct, omit_defaults=True):
    """Where the training steps' time goes: seconds per step, averaged over the last
    ``steps`` steps. A phase that is None was not measured (``notes`` says why); ``other_s``
    is the rest of the step (logging, gradient clipping, zero_grad, host syncs)."""

    steps: int = 0
    step_s: float | None = None
    data_s: float | None = None  # waiting for the DataLoader's next batch
    forward_s: float | None = None  # from the batch (or the previous step) to backward
    backward_s: float | None = None  # backward compute (without the all-reduce wait)
    optimizer_s: float | None = None  # optimizer.step()
    comm_s: float | None = None  # collective wait not hidden: DDP's all-reduce, FSDP2's
    comm_total_s: float | None = None  # FSDP2's collectives' own time, hidden or not
    other_s: float | None = None
    clock: str = ""  # "wall clock" or "CUDA events"
    notes: list[str] = msgspec.field(default_factory=list)
    verdict: Verdict | None = None
    evidence: str = ""  # the figures behind the verdict
    advice: str = ""  # what to try


class NoiseScaleReading(msgspec.Struct, omit_defaults=True):
    """The smoothed simple noise scale; all fields ``None`` until an estimate exists."""

    b_simple: float | None = None
    stderr: float | None = None
    estimator: str | None = None
    coverage: float | None = None
    biased: bool = False
    lower_bound: float | None = None
    samples: int = 0
    skipped_steps: int = 0
    # added with the noise-scale estimator (issue 3); see docs/protocol.md
    ci_low: float | None = None  # 95% interval of b_simple (Fieller)
    ci_high: float | None = None
    needed: int = 0  # effective steps needed before b_simple is shown
    effective: float = 0.0  # effective steps in the moving averages now
    preconditioned: bool = False  # Adam-preconditioned variant
    detail: str | None = None  # the estimator in words, e.g. "4 micro-batches per step"
    note: str | None = None  # why the last step was skipped, or why there is no estimate
    phase: str | None = None  # "warming up" (every step measured) or "tracking" (cost budget)
    # while there is no number: what the estimate is doing, in the agent's words ("collecting
    # 25/30 measured steps; ...", or NONE_WILL_COME and why); the Noise panel shows it as it is
    status: str | None = None
    # the data-parallel ranks whose examples make one step: b_simple counts examples of the
    # whole step, so a rank's batch is compared with it times this (describe.step_batch)
    ranks: int = 1


NONE_WILL_COME = "none — "  # a NoiseScaleReading.status that starts so: no estimate as it runs


# What a batch-size change bought in throughput, said once the step-time noise resolves it
# (batch/verdict.py decides it): "too little measured before it" when the old size ran too
# briefly to compare, "left before a verdict" when another change came first
ThroughputVerdict = Literal[
    "faster",
    "slower",
    "no measurable difference",
    "too little measured before it",
    "left before a verdict",
]


class BatchChange(msgspec.Struct, omit_defaults=True):
    """One applied batch-size change and what it bought (``after`` fills in later)."""

    step: int
    t: float
    old: int
    new: int
    reason: str
    source: str
    samples_per_s_before: float | None = None
    samples_per_s_after: float | None = None
    lr_factor: float | None = None
    lr_note: str | None = None  # "lr 0.001 → 0.00141 (sqrt rule for Adam)", or why unchanged
    optimizer_note: str | None = None  # what else moved: "β2 0.999 → 0.998 (…); moments reset"
    # throughput verdict (the sizes' mean samples/s over all their timed steps, ± standard
    # error; docs/batch-control.md); None while it is being measured
    verdict: ThroughputVerdict | None = None
    samples_per_s_se_before: float | None = None
    samples_per_s_se_after: float | None = None
    # the loss after the change: "held", "diverged" (then "recovered" once back under its
    # threshold), "not logged" (docs/batch-control.md); None: watching
    loss: str | None = None
    # its measured progress per example, in examples at ``old`` (the loss against the old
    # size's own curve carried on, with the interval; docs/autopilot.md); None: not measured
    efficiency: float | None = None
    efficiency_low: float | None = None
    efficiency_high: float | None = None


class MemoryPoint(msgspec.Struct):
    """The job's measured peak allocated memory at one batch size (all devices' maximum)."""

    batch_size: int
    peak_bytes: int
    steps: int


class ThroughputReading(msgspec.Struct, omit_defaults=True):
    """Tokens per second and model FLOPs utilization of this process's device (a rank's own:
    per device). A figure that cannot be known is None with its ``*_note`` saying why."""

    tokens_per_s: float | None = None  # samples/s × the sequence length of the batch's input
    tokens: int | None = None  # trained so far: samples × the sequence length
    seq_len: int | None = None  # tokens per example, read from a watched training step
    tokens_note: str | None = None
    flops_per_sample: float | None = None  # training FLOPs (forward + backward), counted once
    flops_per_s: float | None = None  # achieved: samples/s × flops_per_sample
    peak_flops_per_s: float | None = None  # the device's dense peak for the dtype
    device: str | None = None  # the device's name, as the peak table read it
    dtype: str | None = None  # the matmuls' precision: bf16, fp16, tf32 or fp32
    mfu: float | None = None  # flops_per_s / peak_flops_per_s (a fraction)
    mfu_note: str | None = None


class BatchReading(msgspec.Struct, omit_defaults=True):
    """Batch-size control state: limits, pending change, memory model, history."""

    control: bool = False
    min_size: int = 1
    max_size: int | None = None
    next_up: int | None = None
    next_down: int | None = None
    pending: int | None = None
    applies_at: str | None = None  # where ``pending`` is applied, when not at the next step
    accumulation_steps: int | None = None
    micro_batch_size: int | None = None
    lr_scaling: str | None = None
    lr_rule: str | None = None  # what lr_scaling means for this optimizer, in words
    trained_well: int | None = None  # the last size that trained well (the 2× rule's base)
    memory: list[MemoryPoint] = msgspec.field(default_factory=list)
    memory_budget_bytes: int | None = None
    predicted_max: int | None = None
    predicted_peak_next_up: int | None = None
    probe_max: int | None = None
    changes: list[BatchChange] = msgspec.field(default_factory=list)


class AutopilotDecision(msgspec.Struct, omit_defaults=True):
    """One change the autopilot asked for, and the figures it decided on."""

    step: int
    t: float
    old: int
    new: int
    kind: Literal["grow", "shrink", "revert"]
    b_simple: float | None = None  # the noise scale's estimate then ...
    b_simple_low: float | None = None  # ... and its 95% interval: growth reads √(point·low),
    b_simple_high: float | None = None  # shrinking the high end
    half_batch: float | None = None  # B½ of the step-time model (None: unbounded)
    target: int | None = None  # √(B½·φ), within the limits
    predicted_gain: float | None = None  # progress per second at new over old, predicted
    note: str = ""


AdviceAction = Literal["stay", "raise", "lower", "back", "wait"]
Confidence = Literal["low", "medium", "high"]


class Advice(msgspec.Struct, omit_defaults=True):
    """The one answer to "which batch size?" (probes/batch/advisor.py, docs/batch-control.md):
    the size to run now, the reasons (the one that decided first), how sure it is, and what
    would change it. The Batch and Noise panels, the probe's result, the autopilot, the
    confirmation of a key press and the summary all show this one decision.

    ``action``: ``raise`` / ``lower`` to ``batch_size`` (one change: within 2× of the last size
    that trained well, measured or predicted to fit), ``stay``, ``back`` (the loss diverged
    after the latest change) or ``wait`` (not enough measured yet: stay meanwhile). ``target``
    is where it heads over several changes; ``gain`` the progress per second predicted at
    ``batch_size`` over ``current``; ``headline`` and ``why`` are the short forms a narrow panel
    shows."""

    batch_size: int
    current: int
    action: AdviceAction
    rule: str = ""  # what decided: "goodput", "threshold", "estimate", "diverged", ...
    reasons: list[str] = msgspec.field(default_factory=list)
    confidence: Confidence = "low"
    would_change: str = ""
    target: int | None = None
    gain: float | None = None
    headline: str = ""  # "raise → 128", "stay at 64"
    why: str = ""  # the first reason, short: "1.21× progress/s"
    step: int = 0


AutopilotState = Literal["off", "on", "paused", "refused"]


class AutopilotReading(msgspec.Struct, omit_defaults=True):
    """The autopilot (docs/autopilot.md): whether it steers, what it sees and why it holds.

    ``claimed_gain`` is its progress per second over the spans it drove against a fixed batch
    of the size it was switched on at (``start_size``: the latest; measured there), from
    measured throughput and the noise scale's efficiency; none before its first decision."""

    state: AutopilotState = "off"
    why: str | None = None  # why it is paused or refused
    waiting: str | None = None  # what the next decision waits for, or what it decided last
    held: str | None = None  # why its last look kept the size, short: "holds: 1.03× < 1.05×"
    start_size: int | None = None  # the size it was last switched on at: the claim's base
    size: int | None = None
    b_simple: float | None = None
    b_simple_low: float | None = None
    b_simple_high: float | None = None
    half_batch: float | None = None  # None with a model: throughput still grows linearly
    half_batch_how: str | None = None  # "fitted from 3 sizes", "assumed: ...", "declared ..."
    target: int | None = None
    ceiling: int | None = None  # the largest size it may choose, when one is known
    ceiling_why: str | None = None
    next_decision_step: int | None = None
    claimed_gain: float | None = None
    claimed_note: str | None = None  # how the claim was made, or why there is none
    decisions: list[AutopilotDecision] = msgspec.field(default_factory=list)


class ProbePoint(msgspec.Struct, omit_defaults=True):
    """One batch size the probe ran (or tried): peak memory, step time, and whether it fit."""

    batch_size: int
    fits: bool
    peak_bytes: int | None = None
    static_bytes: int | None = None  # held between steps: weights, optimizer state (+ runtime)
    reserved_bytes: int | None = None
    step_time_s: float | None = None
    samples_per_s: float | None = None
    source: str = "sidecar"  # "sidecar", or "job" for the job's own measured sizes
    note: str | None = None
    confirmation: bool = False  # the prediction run once more before it is recommended


class WhatIf(msgspec.Struct, omit_defaults=True):
    """A way to fit a bigger batch, and the largest batch it is predicted to allow."""

    technique: str
    max_batch_size: int | None
    measured: bool
    note: str = ""


class Recommendation(msgspec.Struct):
    batch_size: int
    reasons: list[str]
    current: int | None = None  # the job's batch size then: equal means "stay"
    # the advisor's (``Advice``) when it made this: how sure, and what would change it
    confidence: str | None = None
    would_change: str | None = None

    @property
    def stay(self) -> bool:
        return self.current == self.batch_size


class ProbeResult(msgspec.Struct, omit_defaults=True):
    """What the sidecar found. ``max_batch_size`` is the largest size that *ran*;
    ``predicted_max`` is a prediction from the memory fit, with ``margin`` taken off."""

    status: Literal["ok", "failed", "crashed", "timeout", "killed", "refused"]
    max_batch_size: int = 0
    points: list[ProbePoint] = msgspec.field(default_factory=list)
    predicted_max: int | None = None
    margin: float = 0.05
    extrapolation: float | None = None
    budget_bytes: int | None = None
    device: str = "cpu"
    fit_intercept_bytes: float | None = None
    fit_slope_bytes: float | None = None
    fit_curvature_bytes: float | None = None  # memory that grows faster than linearly
    # the largest batch a recommendation may use: the prediction once a step at it ran,
    # else the largest size that ran; ``confirmation`` says which, in words
    confirmed_max: int | None = None
    confirmation: str | None = None
    what_ifs: list[WhatIf] = msgspec.field(default_factory=list)
    recommendation: Recommendation | None = None
    error: str | None = None
    duration_s: float = 0.0
    budget_note: str | None = None  # where the budget came from ("25% of ..., at most 1 GiB")
    notes: list[str] = msgspec.field(default_factory=list)  # caveats a person should read


class ProbeReading(msgspec.Struct, omit_defaults=True):
    """The probe as the monitor sees it: idle, running (with progress), or its last result."""

    status: Literal["idle", "running", "done"] = "idle"
    message: str = ""
    started: float | None = None
    points: list[ProbePoint] = msgspec.field(default_factory=list)
    result: ProbeResult | None = None
    blocked: str | None = None  # why a probe cannot start now (None: it can, or one runs)


class RankReading(msgspec.Struct, omit_defaults=True):
    """One rank of a distributed job as rank 0 last heard of it."""

    rank: int
    host: str = ""
    local_rank: int = 0
    step: int | None = None
    step_time_s: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None  # the rank's device's (its throughput reading)
    mfu: float | None = None
    batch_size: int | None = None
    util_percent: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    forward_s: float | None = None
    backward_s: float | None = None
    comm_wait_s: float | None = None  # collective time not hidden behind compute (DDP, FSDP2)
    data_s: float | None = None  # waiting for data per step (step anatomy)
    verdict: Verdict | None = None  # the rank's step-anatomy verdict
    throttled: str | None = None  # its GPU's clocks held down, and why (DeviceReading's)
    sm_clock_mhz: float | None = None
    power_w: float | None = None
    age_s: float | None = None  # since rank 0 last heard from it
    late: bool = False


STRAGGLER_FLAG = 1.10  # a straggler_ratio from this up is shown as a problem


class RanksReading(msgspec.Struct, omit_defaults=True):
    """Every rank on one screen: gathered by rank 0 over a private gloo group."""

    world_size: int
    ranks: list[RankReading] = msgspec.field(default_factory=list)
    straggler: int | None = None  # the rank with the most time of its own (data wait + compute)
    straggler_ratio: float | None = None  # its own time over the median rank's (STRAGGLER_FLAG)
    # what makes it slow, in words: "rN is slow in compute: …" (or data wait), or, where no
    # rank stands out and the ranks wait longer in their collectives than they compute, that
    straggler_cause: str | None = None
    timing: str = ""  # how compute was measured, or why it was not
    global_batch_size: int | None = None


# --------------------------------------------------------------------------------------------
# Server -> client
# --------------------------------------------------------------------------------------------


class Hello(Message, tag="hello"):
    protocol: int
    session: SessionInfo
    step: int
    batch_size: int | None
    capabilities: dict[str, Capability]
    gpu: Capability
    noise_scale: Capability
    devices: list[DeviceReading] = msgspec.field(default_factory=list)
    batch: BatchReading = msgspec.field(default_factory=BatchReading)
    autopilot: AutopilotReading | None = None
    advice: Advice | None = None


class MetricsPoint(msgspec.Struct, omit_defaults=True):
    """One aggregate over a short window of training steps.

    The same shape carries live ``metrics`` messages and the points of a ``history``
    backlog, so a monitor treats both alike.
    """

    t: float
    step: int
    steps: int = 0
    batch_size: int | None = None
    step_time_s: float | None = None
    samples_per_s: float | None = None
    samples: int | None = 0
    scalars: dict[str, float] = msgspec.field(default_factory=dict)
    noise: NoiseScaleReading | None = None
    anatomy: StepAnatomy | None = None


class Metrics(Message, tag="metrics"):
    t: float
    step: int
    batch_size: int | None
    step_time_s: float | None
    samples_per_s: float | None
    b_simple: float | None
    samples: int | None = 0  # None: the job's samples are not counted (samples_note says why)
    samples_note: str | None = None
    # the examples per step change step to step ("varies 10–500 per step"): batch_size is the
    # last step's; None: one size holds
    batch_varies: str | None = None
    eval_s: float = 0.0  # evaluation inside the training loop so far, not in step times
    steps_in_window: int = 0
    idle_s: float | None = None
    scalars: dict[str, float] = msgspec.field(default_factory=dict)
    # what a scalar's value is, where it is not what its name suggests
    # ({"loss": "summed over the batch"}: the script's loss sums its examples)
    scalar_notes: dict[str, str] = msgspec.field(default_factory=dict)
    noise: NoiseScaleReading = msgspec.field(default_factory=NoiseScaleReading)
    anatomy: StepAnatomy | None = None
    devices: list[DeviceReading] = msgspec.field(default_factory=list)
    gpu: Capability = msgspec.field(default_factory=lambda: Capability(available=False))
    host: HostReading = msgspec.field(default_factory=HostReading)
    batch: BatchReading = msgspec.field(default_factory=BatchReading)
    throughput: ThroughputReading | None = None  # None: an agent from before issue 45
    probe: ProbeReading = msgspec.field(default_factory=ProbeReading)
    ranks: RanksReading | None = None
    autopilot: AutopilotReading | None = None
    advice: Advice | None = None
    errors: int = 0
    dropped: int = 0


class History(Message, tag="history"):
    """A chunk of the backlog sent on connect; ``final`` marks the last chunk."""

    points: list[MetricsPoint]
    final: bool = True


class Event(Message, tag="event"):
    t: float
    step: int
    kind: str
    message: str
    level: Literal["info", "warning", "error"] = "info"
    data: dict[str, Any] = msgspec.field(default_factory=dict)


class Reply(Message, tag="reply"):
    id: CommandId
    ok: bool
    error: str | None = None
    result: dict[str, Any] | None = None


class BatchSizeResult(msgspec.Struct, omit_defaults=True):
    """The ``result`` of a reply to ``set_batch_size`` or ``step_batch_size``: accepted (``old``,
    ``new``, and when it applies), or refused until confirmed (``needs_confirmation``, the
    ``value`` to send again with ``confirm``, and ``why``). On the wire it is the reply's
    ``result`` object, field for field."""

    old: int | None = None
    new: int | None = None
    step: int | None = None
    applies_after_step: int | None = None  # the step after which the change applies
    applies_at: str | None = None  # where the job applies it, in words ("at the end of the epoch")
    needs_confirmation: bool = False
    value: int | None = None
    why: str | None = None

    def as_result(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)

    @classmethod
    def of(cls, reply: Reply) -> BatchSizeResult:
        """A reply's result read as this (empty where it is missing or not of this shape)."""
        try:
            return msgspec.convert(reply.result or {}, cls)
        except msgspec.ValidationError:
            return cls()


class Notice(Message, tag="notice"):
    """A connection-level message that is not a reply, e.g. why the server is closing it."""

    message: str
    closing: bool = False


class Bye(Message, tag="bye"):
    """The job is finishing on purpose: a monitor shows "finished", not "disconnected"."""

    reason: str
    t: float


# --------------------------------------------------------------------------------------------
# Client -> server
# --------------------------------------------------------------------------------------------


class Command(Message, kw_only=True):
    id: CommandId = None


class Ping(Command, tag="ping"):
    pass


class SetBatchSize(Command, tag="set_batch_size", kw_only=True):
    value: Annotated[int, msgspec.Meta(ge=1, le=MAX_BATCH_SIZE)]
    confirm: bool = False
    reason: Annotated[str, msgspec.Meta(max_length=MAX_TEXT_CHARS)] = ""


class StepBatchSize(Command, tag="step_batch_size", kw_only=True):
    direction: Literal["up", "down"]
    confirm: bool = False


class AutopilotCommand(Command, tag="autopilot"):
    on: bool


class ProbeCommand(Command, tag="probe"):
    memory_budget: int | None = None
    timeout_s: float | None = None


CLIENT_COMMANDS: dict[str, type[Command]] = {
    "ping": Ping,
    "set_batch_size": SetBatchSize,
    "step_batch_size": StepBatchSize,
    "probe": ProbeCommand,
    "autopilot": AutopilotCommand,
}

SERVER_MESSAGES: dict[str, type[Message]] = {
    "hello": Hello,
    "history": History,
    "metrics": Metrics,
    "event": Event,
    "reply": Reply,
    "notice": Notice,
    "bye": Bye,
}


class ProtocolError(ValueError):
    """A line that is not a valid message; ``id`` is the command id when one could be read."""

    def __init__(self, message: str, command_id: CommandId = None) -> None:
        super().__init__(message)
        self.command_id = command_id


_encoder = msgspec.json.Encoder()


def encode(message: msgspec.Struct) -> bytes:
    """One message as one line of JSON, newline included."""
    return _encoder.encode(message) + b"\n"


def decode_json(line: bytes | str) -> Any:
    """Any JSON value, or ProtocolError. msgspec raises more than DecodeError on hostile input:
    RecursionError for deep nesting, and before 0.23 UnicodeDecodeError for a string that is
    not UTF-8 (0.23 raises a DecodeError of its own wording, so the bytes are checked here)."""
    try:
        return msgspec.json.decode(line)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"not valid JSON: {_describe_decode_error(line, exc)}") from None
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"not valid JSON: {_not_utf8(exc)}") from None
    except RecursionError:
        raise ProtocolError("not valid JSON: nested too deeply") from None


def _decode_object(line: bytes | str) -> dict[str, Any]:
    obj = decode_json(line)
    if not isinstance(obj, dict):
        raise ProtocolError(f"a message must be a JSON object, got {_json_kind(obj)}")
    return obj


def decode_command(line: bytes | str) -> Command:
    """Parse one client line into a command, or raise ProtocolError with a readable reason."""
    return command_of(_decode_object(line))


def command_of(obj: dict[str, Any]) -> Command:
    """A command from its fields as plain data (a decoded line, or the job's own call), with
    every check a line gets; raises ProtocolError with a readable reason."""
    command_id = obj.get("id")
    valid_id = isinstance(command_id, (int, str)) and not isinstance(command_id, bool)
    if command_id is not None and not valid_id:
        raise ProtocolError("`id` must be an integer or a string", None)
    if isinstance(command_id, str) and len(command_id) > MAX_TEXT_CHARS:
        raise ProtocolError(f"`id` must be at most {MAX_TEXT_CHARS} characters long", None)
    kind = obj.get("type")
    if kind is None:
        raise ProtocolError("missing field `type`", command_id)
    if not isinstance(kind, str):
        raise ProtocolError(f"`type` must be a string, got {_json_kind(kind)}", command_id)
    cls = CLIENT_COMMANDS.get(kind)
    if cls is None:
        known = ", ".join(sorted(CLIENT_COMMANDS))
        raise ProtocolError(f"unknown command type {_shown(kind)!r}; known: {known}", command_id)
    try:
        return msgspec.convert(obj, type=cls)
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"{kind}: {_describe_validation_error(exc, cls)}", command_id) from None


def decode_server_message(line: bytes | str) -> Message | None:
    """Parse one server line; ``None`` for a message type this client does not know."""
    obj = _decode_object(line)
    kind = obj.get("type")
    cls = SERVER_MESSAGES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        return None
    try:
        return msgspec.convert(obj, type=cls)
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"{obj.get('type')}: {_describe_validation_error(exc, cls)}") from None


def to_builtins(message: msgspec.Struct) -> dict[str, Any]:
    """A message as plain Python data (for ``--json`` output and records)."""
    return msgspec.to_builtins(message)


_JSON_KINDS = {
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "bool": "a boolean",
    "null": "null",
    "array": "an array",
    "object": "an object",
}


def _json_kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "null" if value is None else "an object"


_EXPECTED = re.compile(
    r"Expected `(?P<want>[^`]+)`, got `(?P<got>[^`]+)`(?: - at `\$\.(?P<at>[^`]+)`)?"
)
_BOUND = re.compile(
    r"Expected `(?P<want>\w+)` (?P<op>[<>]=?) (?P<bound>[-\d.e]+)(?: - at `\$\.(?P<at>[^`]+)`)?"
)
_LENGTH = re.compile(r"Expected `str` of length <= (?P<bound>\d+)(?: - at `\$\.(?P<at>[^`]+)`)?")
_MISSING = re.compile(r"Object missing required field `(?P<field>[^`]+)`")
_INVALID = re.compile(r"Invalid enum value (?P<value>.+?)(?: - at `\$\.(?P<at>[^`]+)`)?$")


def _describe_validation_error(exc: msgspec.ValidationError, cls: type) -> str:
    text = str(exc)
    if m := _LENGTH.match(text):
        return f"`{m['at']}` must be at most {m['bound']} characters long"
    if m := _BOUND.match(text):
        words = {">=": "at least", ">": "greater than", "<=": "at most", "<": "less than"}
        return f"`{m['at']}` must be {words[m['op']]} {m['bound']}"
    if m := _EXPECTED.match(text):
        want = " or ".join(_JSON_KINDS.get(w.strip(), w.strip()) for w in m["want"].split("|"))
        got = _JSON_KINDS.get(m["got"], m["got"])
        return f"`{m['at']}` must be {want}, got {got}"
    if m := _MISSING.match(text):
        return f"missing field `{m['field']}`"
    if m := _INVALID.match(text):
        allowed = _literal_values(cls, m["at"])
        value = _shown(m["value"])
        if allowed:
            return f"`{m['at']}` must be one of {', '.join(map(repr, allowed))}, got {value}"
        return f"`{m['at']}` has an invalid value {value}"
    return text


def _shown(text: str) -> str:
    """``text`` as a reply quotes it: a reply never echoes a megabyte."""
    return text if len(text) <= ECHO_CHARS else text[:ECHO_CHARS] + "…"


def _literal_values(cls: type, field_name: str) -> tuple[Any, ...]:
    for field in msgspec.structs.fields(cls):
        if field.name == field_name and get_origin(field.type) is Literal:
            return get_args(field.type)
    return ()


def _describe_decode_error(line: bytes | str, exc: msgspec.DecodeError) -> str:
    if isinstance(line, bytes):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as bad:
            return _not_utf8(bad)
    return str(exc).removeprefix("JSON is malformed: ") or "malformed"


def _not_utf8(exc: UnicodeDecodeError) -> str:
    return f"not UTF-8 ({exc.reason})"
