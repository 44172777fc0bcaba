"""Synthetic session records whose every value is known, for summary, replay and CLI tests."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from bsmon.probes.record.buckets import StatAcc, single, step_bin
from bsmon.probes.record.format import (
    DeviceSpan,
    End,
    HostSpan,
    ProbeLine,
    Span,
    Status,
    encode_line,
    header_for,
)
from bsmon.probes.wire.protocol import Capability, Event, SessionInfo

START = 1_700_000_000.0
GIB = 2**30


def session(name: str = "synthetic", start: float = START) -> SessionInfo:
    return SessionInfo(
        name=name,
        pid=4242,
        host="gpu-box-7",
        argv=["train.py", "--lr", "0.1"],
        start_time=start,
        python="3.11.7",
        torch_version="2.13.0",
        bsmon_version="0.1.0",
        cwd="/work",
    )


def make_span(
    t0: float,
    t1: float,
    first_step: int,
    step_times: list[float],
    batch_size: int,
    samples_before: int,
    *,
    loss: float | None = None,
    util: float | None = None,
    mem_used: int | None = None,
    b_simple: float | None = None,
) -> Span:
    """A base span over ``step_times`` (one per step), built the way the recorder builds it."""
    acc, hist = StatAcc(), {}
    for duration in step_times:
        acc.add(duration)
        hist[step_bin(duration)] = hist.get(step_bin(duration), 0) + 1
    steps = len(step_times)
    timed_s = sum(step_times)
    devices = []
    if util is not None or mem_used is not None:
        devices = [
            DeviceSpan(
                index=0,
                name="NVIDIA H100 80GB HBM3",
                util=single(util),
                util_hist={round(util): 1} if util is not None else {},
                mem_used=single(mem_used),
                mem_total=80 * GIB,
                torch_peak=mem_used - GIB if mem_used else None,
                torch_allocated=single(mem_used - 2 * GIB) if mem_used else None,
                torch_reserved=mem_used - GIB // 2 if mem_used else None,
                temperature=single(60.0),
                power=single(400.0),
            )
        ]
    return Span(
        t0=t0,
        t1=t1,
        step=first_step + steps - 1 if steps else first_step - 1,
        steps=steps,
        samples=samples_before + steps * batch_size,
        batch_size=batch_size,
        timed_steps=steps,
        timed_s=timed_s,
        timed_samples=steps * batch_size,
        step_time=acc.stat(),
        step_hist=hist,
        throughput=single(steps * batch_size / timed_s) if timed_s else None,
        scalars={"loss": single(loss)} if loss is not None else {},  # type: ignore[dict-item]
        b_simple=single(b_simple),
        devices=devices,
        host=HostSpan(cpu=single(100.0), rss=single(2 * GIB)),
    )


@dataclass
class Phase:
    batch_size: int
    spans: int
    step_times: list[float]  # the durations of the steps of every span in this phase


@dataclass
class Synthetic:
    """A record of phases at fixed batch sizes, with everything it contains kept for checks."""

    phases: list[Phase]
    name: str = "synthetic"
    bucket_s: float = 0.5
    complete: bool = True
    wobble: float = 0.0  # step times vary by this fraction from span to span (for pictures)
    spans: list[Span] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    all_step_times: list[float] = field(default_factory=list)
    utils: list[float] = field(default_factory=list)
    mem_peak: int = 0
    steps: int = 0
    samples: int = 0

    def __post_init__(self) -> None:
        t, k = START, 0
        self.events.append(Event(t=START + 0.01, step=0, kind="attached", message="attached"))
        for phase in self.phases:
            for _ in range(phase.spans):
                util = float(40 + (k * 7) % 61)  # 40..100, known
                mem = (20 + k % 13) * GIB
                scale = 1 + self.wobble * math.sin(k / 6)
                step_times = [d * scale for d in phase.step_times]
                span = make_span(
                    t,
                    t + self.bucket_s,
                    self.steps + 1,
                    step_times,
                    phase.batch_size,
                    self.samples,
                    loss=2.0 / (1 + k),
                    util=util,
                    mem_used=mem,
                    b_simple=100.0 + k,
                )
                self.spans.append(span)
                self.all_step_times += step_times
                self.utils.append(util)
                self.mem_peak = max(self.mem_peak, mem)
                self.steps, self.samples = span.step, span.samples
                t += self.bucket_s
                k += 1
            self.events.append(
                Event(
                    t=t - 0.1,
                    step=self.steps,
                    kind="slow_phase",
                    level="warning",
                    message=f"phase at batch {phase.batch_size} ended",
                )
            )
        self.stop = t

    def lines(self) -> list[bytes]:
        header = header_for(session(self.name), self.phases[0].batch_size, START)
        gpu = Status(t=START, gpu=Capability(True), noise_scale=Capability(True, None))
        out = [encode_line(header), encode_line(gpu)]
        events = list(self.events)
        for span in self.spans:
            while events and events[0].t <= span.t1:
                out.append(encode_line(events.pop(0)))
            out.append(encode_line(span))
        out += [encode_line(e) for e in events]
        out.append(
            encode_line(ProbeLine(t=self.stop, step=self.steps, result={"max_batch_size": 512}))
        )
        if self.complete:
            end = End(t=self.stop, reason="closed", step=self.steps, samples=self.samples)
            out.append(encode_line(end))
        return out

    def write(self, path: Path, tail: bytes = b"") -> Path:
        path.write_bytes(b"".join(self.lines()) + tail)
        return path


def two_phase(complete: bool = True, wobble: float = 0.0) -> Synthetic:
    """Batch 32 for 100 spans of 10 steps (10..19 ms), then batch 64 for 50 (20..29 ms)."""
    return Synthetic(
        [
            Phase(32, 100, [0.010 + 0.001 * i for i in range(10)]),
            Phase(64, 50, [0.020 + 0.001 * i for i in range(10)]),
        ],
        complete=complete,
        wobble=wobble,
    )
