"""Live readings and record spans, each turned into the other.

Export (a summary made from what the dashboard holds) turns the dashboard's history points
into spans; replay turns a record's spans back into the readings the dashboard shows, and its
autopilot events into the autopilot's reading (``autopilot_after``). The recorder uses
``device_span`` for each device sample. A span keeps min/mean/max, not the live
reading's uncertainty, so a point made from a span says so where it matters.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import get_args

import msgspec

from ..anatomy.verdict import judged
from ..anatomy.window import anatomy_of, totals_of
from ..wire.protocol import (
    Advice,
    AutopilotDecision,
    AutopilotReading,
    AutopilotState,
    DeviceReading,
    Event,
    Metrics,
    MetricsPoint,
    NoiseScaleReading,
    SessionInfo,
    StepAnatomy,
)
from .buckets import single, step_bin
from .format import DeviceSpan, HostSpan, Span, Stat, span_throughput


def device_span(reading: DeviceReading) -> DeviceSpan:
    util = reading.util_percent
    return DeviceSpan(
        index=reading.index,
        name=reading.name,
        util=single(util),
        util_hist={round(util): 1} if util is not None and math.isfinite(util) else {},
        mem_used=single(reading.memory_used_bytes),
        mem_total=reading.memory_total_bytes,
        torch_peak=reading.torch_peak_bytes,
        torch_allocated=single(reading.torch_allocated_bytes),
        torch_reserved=reading.torch_reserved_bytes,
        torch_reserved_peak=reading.torch_reserved_peak_bytes,
        alloc_retries=reading.alloc_retries,
        ooms=reading.ooms,
        temperature=single(reading.temperature_c),
        power=single(reading.power_w),
        error=reading.error,
    )


def latest_span(latest: Metrics, t: float) -> Span:
    """The latest readings as a zero-length span at ``t`` (its devices and host)."""
    return Span(
        t0=t,
        t1=t,
        step=latest.step,
        samples=latest.samples or 0,
        batch_size=latest.batch_size,
        devices=[device_span(d) for d in latest.devices],
        host=HostSpan(cpu=single(latest.host.cpu_percent), rss=single(latest.host.rss_bytes)),
    )


def spans_from_points(points: tuple[MetricsPoint, ...], start: float) -> list[Span]:
    """The dashboard's history as spans, each point standing for its window's steps."""
    spans, t0 = [], start
    for p in points:
        timed_s = p.step_time_s * p.steps if p.step_time_s else 0.0
        st = p.step_time_s
        spans.append(
            Span(
                t0=t0,
                t1=p.t,
                step=p.step,
                steps=p.steps,
                samples=p.samples or 0,
                batch_size=p.batch_size,
                timed_steps=p.steps if st else 0,
                timed_s=timed_s,
                timed_samples=round(p.samples_per_s * timed_s) if p.samples_per_s else 0,
                uncounted_s=timed_s if p.samples_per_s is None else 0.0,
                step_time=Stat(p.steps, st, st, st) if st else None,
                step_hist={step_bin(st): p.steps} if st and st > 0 else {},
                throughput=single(p.samples_per_s),
                scalars={k: Stat(1, v, v, v) for k, v in p.scalars.items()},
                b_simple=single(p.noise.b_simple) if p.noise else None,
                phases=totals_of(p.anatomy) if p.anatomy is not None else None,
            )
        )
        t0 = p.t
    return spans


def point_of(span: Span) -> MetricsPoint:
    return MetricsPoint(
        t=span.t1,
        step=span.step,
        steps=span.steps,
        batch_size=span.batch_size,
        step_time_s=span.timed_s / span.timed_steps if span.timed_steps else None,
        samples_per_s=span_throughput(span),
        samples=span.samples if span.samples or not span.uncounted_s else None,
        scalars={name: stat.mean for name, stat in span.scalars.items()},
        noise=recorded_noise(span),
        anatomy=anatomy_of(span.phases) if span.phases is not None else None,
    )


def recorded_noise(span: Span) -> NoiseScaleReading | None:
    """A record keeps B_simple's min/mean/max per span, not the live reading's uncertainty."""
    if span.b_simple is None:
        return None
    return NoiseScaleReading(b_simple=span.b_simple.mean, detail="as recorded: the span's mean")


def device_reading(d: DeviceSpan) -> DeviceReading:
    return DeviceReading(
        index=d.index,
        name=d.name,
        util_percent=d.util.mean if d.util else None,
        memory_used_bytes=int(d.mem_used.max) if d.mem_used else None,
        memory_total_bytes=d.mem_total,
        temperature_c=d.temperature.mean if d.temperature else None,
        power_w=d.power.mean if d.power else None,
        torch_peak_bytes=d.torch_peak,
        torch_allocated_bytes=int(d.torch_allocated.mean) if d.torch_allocated else None,
        torch_reserved_bytes=d.torch_reserved,
        torch_reserved_peak_bytes=d.torch_reserved_peak,
        alloc_retries=d.alloc_retries,
        ooms=d.ooms,
        error=d.error,
    )


def recorded_anatomy(span: Span, session: SessionInfo) -> StepAnatomy | None:
    """The step anatomy of a span's phases, with the verdict the live job would have given."""
    return judged(span.phases, session.world_size, ddp=session.ddp, fsdp2=session.fsdp2)


def run_anatomy(spans: Iterable[Span], session: SessionInfo) -> StepAnatomy | None:
    """The step anatomy over every span that split its steps: the whole run, with its verdict."""
    totals = None
    for span in spans:
        if span.phases is not None:
            totals = span.phases if totals is None else totals.merged(span.phases)
    return judged(totals, session.world_size, ddp=session.ddp, fsdp2=session.fsdp2)


def autopilot_after(reading: AutopilotReading | None, event: Event) -> AutopilotReading | None:
    """The autopilot's reading as its events rebuild it (replay): the state, why and the rule
    that holds it from ``autopilot_state``; each decision, the target, B½ and the claim so far from
    ``autopilot``. An event whose data does not read as the protocol says leaves it as it was
    (a record may be damaged)."""
    data = event.data or {}
    try:
        if event.kind == "autopilot_state" and data.get("state") in get_args(AutopilotState):
            base = reading or AutopilotReading()
            return msgspec.structs.replace(
                base,
                state=data["state"],
                why=data.get("why"),
                start_size=data.get("start_size", base.start_size),
                claimed_gain=data.get("claimed_gain", base.claimed_gain),
                held=held if isinstance(held := data.get("held"), str) else None,
            )
        if event.kind == "autopilot":
            decision = msgspec.convert(data["decision"], AutopilotDecision)
            base = reading or AutopilotReading(state="on", start_size=decision.old)
            half = decision.half_batch
            return msgspec.structs.replace(
                base,
                size=decision.new,
                decisions=[*base.decisions, decision],
                target=decision.target if decision.target is not None else base.target,
                half_batch=half if half is not None else base.half_batch,
                half_batch_how="as recorded" if half is not None else base.half_batch_how,
                claimed_gain=data.get("claimed_gain", base.claimed_gain),
                held=None,  # a decision: nothing holds it
            )
    except (KeyError, TypeError, msgspec.ValidationError):
        return reading
    return reading


def advice_after(advice: Advice | None, event: Event) -> Advice | None:
    """The advisor's answer as its ``advice`` events rebuild it (replay); an event whose data
    does not read as the protocol says leaves it as it was (a record may be damaged)."""
    if event.kind != "advice":
        return advice
    try:
        return msgspec.convert(event.data["advice"], Advice)
    except (KeyError, TypeError, msgspec.ValidationError):
        return advice
