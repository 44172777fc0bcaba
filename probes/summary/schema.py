"""The shape of ``summary.json``, version 1 (docs/summary.md describes every field).

Times are Unix seconds, or seconds into the run where a name ends in ``_s``; sizes are bytes;
``null`` means "not measured" (the reason is among the warnings when there is one).
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..wire.protocol import StepAnatomy

SUMMARY_VERSION = 1

Point = tuple[float, float]


class Source(msgspec.Struct):
    kind: str  # "record", or "dashboard" when exported from what a dashboard held
    path: str | None = None
    record_version: int | None = None
    lines: int = 0
    torn_tail: bool = False  # the record's last line was cut short and left out
    resolution_s: float | None = None  # the coarsest span in the record (older data is merged)


class Run(msgspec.Struct):
    name: str
    pid: int
    host: str
    argv: list[str]
    cwd: str
    python: str
    torch_version: str
    bsmon_version: str
    rank: int
    world_size: int
    start_time: float
    end_time: float
    start: str  # ISO 8601, local time with offset
    end: str
    complete: bool  # the job closed its monitor (an `end` line); false: killed or still running
    end_reason: str | None = None
    recording_stopped: str | None = None  # why the recording stopped before the job ended
    running: bool = False  # exported live: the monitor saw the job running when it exported


class StepTime(msgspec.Struct):
    timed_steps: int = 0
    mean: float | None = None
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    min: float | None = None
    max: float | None = None


class Throughput(msgspec.Struct):
    samples_per_s: float | None = None  # over all timed steps
    steps_per_s: float | None = None
    best_samples_per_s: float | None = None  # the best half second
    worst_samples_per_s: float | None = None
    # a sequence model's: tokens trained, tokens/s over the timed steps (samples/s × the
    # tokens an example carried), and the mean model FLOPs utilization (a fraction); absent
    # where the job has none (not a sequence model, or a device with no known peak)
    tokens: int | None = None
    tokens_per_s: float | None = None
    mfu_mean: float | None = None


class Device(msgspec.Struct):
    index: int
    name: str
    readings: int = 0
    util_mean_percent: float | None = None
    util_p95_percent: float | None = None
    util_max_percent: float | None = None
    memory_peak_bytes: int | None = None
    memory_total_bytes: int | None = None
    memory_peak_fraction: float | None = None
    torch_peak_bytes: int | None = None
    torch_reserved_peak_bytes: int | None = None
    # peak reserved as a share of the device's memory (torchtitan's max_reserved %)
    torch_reserved_peak_fraction: float | None = None
    alloc_retries: int | None = None  # the allocator's cudaMalloc retries, by the run's end
    ooms: int | None = None  # out-of-memory errors the job raised (and survived, if it went on)
    temperature_max_c: float | None = None
    power_mean_w: float | None = None


class Host(msgspec.Struct):
    cpu_mean_percent: float | None = None
    rss_peak_bytes: int | None = None


class NoiseScale(msgspec.Struct):
    start: float | None = None
    end: float | None = None
    min: float | None = None
    max: float | None = None
    trajectory: list[Point] = msgspec.field(default_factory=list)  # (step, B_simple)
    note: str | None = None  # why there is no estimate, when there is none


class TimeSplit(msgspec.Struct):
    """Where the run's wall time went: its steps, evaluation inside the training loop (kept
    out of step times), and the rest (start-up, untimed steps, pauses)."""

    steps_s: float = 0.0
    evaluation_s: float = 0.0
    other_s: float = 0.0


class BatchSegment(msgspec.Struct):
    """A stretch of the run at one batch size, in order."""

    batch_size: int | None
    from_step: int
    to_step: int
    start_s: float
    duration_s: float
    steps: int
    samples_per_s: float | None
    step_time_s: float | None
    # batch_size None because the examples per step changed step to step: their range, said
    varies: str | None = None


class BatchSize(msgspec.Struct):
    """Everything the run did at one batch size: the throughput that size reached."""

    batch_size: int | None
    steps: int
    duration_s: float  # the time of its timed steps (the sizes add up to ``time.steps_s``)
    samples_per_s: float | None
    best_samples_per_s: float | None
    step_time_p50_s: float | None
    # the standard error of samples_per_s, from the scatter of its spans (the live
    # throughput verdicts use the same estimator: probes/batch/verdict.py)
    samples_per_s_se: float | None = None
    # batch_size None because the examples per step changed step to step: their range, said
    varies: str | None = None
    # steps (in steps) and their seconds (in duration_s) run while a probe's sidecar shared
    # the device: left out of samples_per_s, its SE, best_samples_per_s and step_time_p50_s
    left_out_steps: int = 0
    left_out_s: float = 0.0


class Scalar(msgspec.Struct):
    n: int
    first: float
    last: float
    min: float
    max: float
    mean: float
    note: str | None = None  # what the value is, where not what its name says ("summed ...")


class Note(msgspec.Struct, omit_defaults=True):
    """A warning or a recommendation: a kind to match on and a sentence for a person."""

    kind: str
    message: str
    step: int | None = None
    t_s: float | None = None


class Autopilot(msgspec.Struct):
    """What the autopilot did (docs/autopilot.md): its decisions in order (each as its event's
    ``data.decision``: step, old, new, kind, b_simple with its interval, half_batch, target,
    predicted_gain), what it said (on, off, paused, refused, what held it, the end), and the
    gain it claimed at the end over the steps it drove, against a fixed batch of
    ``start_size``, the size it was (last) switched on at."""

    decisions: list[dict[str, Any]]
    said: list[Note]
    claimed_gain: float | None = None
    start_size: int | None = None


class FinalWord(msgspec.Struct):
    """The advisor's answer as the job ended (docs/batch-control.md), its event's
    ``data.advice``: ``batch_size``, ``current``, ``action``, ``reasons`` (the deciding one
    first), ``confidence``, ``would_change``; ``ended_without``: the record has no final word
    (the job was killed), so this is its last answer before that. ``said``: each answer it gave
    as the run went, in order: how it got there."""

    advice: dict[str, Any]
    said: list[Note]
    ended_without: bool = False


class Summary(msgspec.Struct):
    summary_version: int
    generated: float
    source: Source
    run: Run
    duration_s: float
    steps: int
    samples: int | None  # null: the job's samples were not counted (a warning says why)
    step_time_s: StepTime
    throughput: Throughput
    devices: list[Device]
    no_devices_reason: str | None  # why ``devices`` is empty (e.g. a CPU-only job)
    host: Host
    b_simple: NoiseScale
    batch_size_history: list[BatchSegment]
    batch_sizes: list[BatchSize]
    scalars: dict[str, Scalar]
    events: dict[str, int]  # counts by level, and "total"
    probes: list[dict[str, Any]]
    warnings: list[Note]
    recommendations: list[Note]
    series: dict[str, list[Point]]  # bounded chart data: (step or seconds, value)
    time: TimeSplit = msgspec.field(default_factory=TimeSplit)
    anatomy: StepAnatomy | None = None  # where the steps' time went, with the verdict
    autopilot: Autopilot | None = None  # None: it was never switched on
    final_word: FinalWord | None = None  # None: no advisor (no batch size declared, old record)
