"""The summary of a session: computed from its record in one streaming pass, written as
``summary.json`` (schema: ``schema``, docs/summary.md) and ``summary.md`` (``markdown``).

Memory stays bounded whatever the record's length: histograms have a bounded number of
bins, chart series are decimated, and lists (segments, warnings, probes) are capped.

Why one module: the pass folds spans, events, statuses and probe results into one builder
whose parts read each other's totals (segments need the step-time totals, the noise note the
spans' counts); split, that state would be handed around instead.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec

from ..anatomy.seconds import PhaseTotals
from ..anatomy.verdict import judged
from ..batch.verdict import SizeThroughput
from ..record.buckets import (
    add_counts,
    merge_devices,
    merge_range,
    merge_stat,
    quantiles,
    step_bin_value,
)
from ..record.format import (
    DeviceSpan,
    End,
    Header,
    ProbeLine,
    Span,
    Stat,
    Status,
    span_throughput,
    throughput,
)
from ..record.history import DecimatingHistory
from ..record.reader import RecordReader, open_record
from ..wire.describe import batch_varies
from ..wire.discovery import replace_atomically
from ..wire.protocol import Event, StepAnatomy
from .probe_runs import ProbeRuns
from .recommend import recommendations
from .schema import (
    SUMMARY_VERSION,
    Autopilot,
    BatchSegment,
    BatchSize,
    Device,
    FinalWord,
    Host,
    NoiseScale,
    Note,
    Point,
    Run,
    Scalar,
    Source,
    StepTime,
    Summary,
    Throughput,
    TimeSplit,
)

SERIES_POINTS = 256
NOISE_STEPS_NEEDED = 30  # the noise reading's ``needed`` at its defaults
WARMUP_ENDED = "noise scale: no estimate yet — "  # the noise controller's event: warm-up over
MAX_SEGMENTS = 1000
MAX_LISTED = 100  # warnings from events, probe results


NOISE_OFF = "noise scale: off — "  # the estimator's warning when it stops for good


def _noise_reason(message: str) -> str | None:
    """Why the estimate is missing, from one of the noise scale's warning events."""
    for prefix in (NOISE_OFF, "noise scale: no estimate — "):
        if message.startswith(prefix):
            return message.removeprefix(prefix)
    if "skipped step" in message:
        reason = message.split(": ", 2)[-1].removesuffix(" (further skips are only counted)")
        return f"measured steps were skipped ({reason})"
    return None


def _merge_xyw(a: tuple[float, float, float], b: tuple[float, float, float]) -> tuple:
    weight = a[2] + b[2]
    return (b[0], (a[1] * a[2] + b[1] * b[2]) / weight if weight else b[1], weight)


class _Series:
    """A bounded chart series: neighbours merge (weighted means) as it grows."""

    def __init__(self) -> None:
        self._history: DecimatingHistory[tuple[float, float, float]] = DecimatingHistory(
            _merge_xyw, SERIES_POINTS
        )

    def add(self, x: float, y: float | None, weight: float = 1.0) -> None:
        if y is not None and math.isfinite(y):
            self._history.append((x, y, max(weight, 1e-12)))

    def points(self) -> list[Point]:
        return [(x, _round(y)) for x, y, _ in self._history]  # type: ignore[misc]


@dataclass
class _Segment:
    batch_size: int | None
    from_step: int
    t0: float
    to_step: int = 0
    t1: float = 0.0
    steps: int = 0
    timed_steps: int = 0
    timed_s: float = 0.0
    timed_samples: int = 0
    uncounted_s: float = 0.0
    varies: list[int] | None = None  # no one size: the least and most examples per step


def _segment_key(seg: _Segment) -> tuple[int | None, bool]:
    """A segment's batch size, and whether it is one that varies step to step."""
    return seg.batch_size, seg.varies is not None


@dataclass
class _SizeTotals:
    """One size's steps; its throughput figures leave out those a probe shared."""

    steps: int = 0
    left_out_steps: int = 0  # in spans a probe's sidecar shared
    left_out_s: float = 0.0  # their timed seconds
    timed_s: float = 0.0
    timed_samples: int = 0
    uncounted_s: float = 0.0
    best: float | None = None
    hist: dict[int, int] = field(default_factory=dict)
    windows: SizeThroughput = field(default_factory=SizeThroughput)
    varies: list[int] | None = None  # no one size: the least and most examples per step


class SummaryBuilder:
    """Feed it a record's lines in order (``add``), then ``finish``."""

    def __init__(self, header: Header, source: Source) -> None:
        self.header = header
        self.source = source
        self.start = header.session.start_time
        self.last_t = self.start
        self.steps = 0
        self.samples = 0
        self.timed_steps = 0
        self.timed_s = 0.0
        self.timed_samples = 0
        self.uncounted_s = 0.0
        self.eval_s = 0.0
        self.step_time: Stat | None = None
        self.throughput: Stat | None = None
        self.tokens: int | None = None  # at the last span that knew them
        self.tokens_samples = 0  # the samples then
        self.mfu: Stat | None = None
        self.hist: dict[int, int] = {}
        self.devices: dict[int, DeviceSpan] = {}
        self.cpu: Stat | None = None
        self.rss: Stat | None = None
        self.scalars: dict[str, tuple[Stat, float, float]] = {}  # stat, first, last
        self.noise: Stat | None = None
        self.noise_first: float | None = None
        self.noise_steps = 0  # steps the noise scale had measured and used, at the last span
        self.noise_at_least: float | None = None
        self.noise_last: float | None = None
        self.segments: list[_Segment] = []
        self.segments_left_out = 0
        # by batch size, and whether the size varied step to step (then None)
        self.sizes: dict[tuple[int | None, bool], _SizeTotals] = {}
        self.probe_runs = ProbeRuns()
        self.events: dict[str, int] = {"total": 0, "info": 0, "warning": 0, "error": 0}
        self.autopilot: Autopilot | None = None
        self.final_word: FinalWord | None = None
        self.event_notes: list[Note] = []
        self.divergences: dict[int, int] = {}  # a loss_diverged note's change step: its index
        self.probes: list[dict[str, Any]] = []
        self.probes_left_out = 0
        self.gpu_reason: str | None = None
        self.noise_reason: str | None = None  # the job's word on why there is no estimate
        self.noise_source: str | None = None  # the estimator the job last reported
        self.noise_warmup: str | None = None  # what the warm-up measured, when it ran out
        self.noise_off: str | None = None  # why the estimator stopped for good, if it did
        self.scalar_notes: dict[str, str] = {}  # a loss_units event's: {"loss": "summed ..."}
        self.resolution_s = 0.0
        self.end: End | None = None
        self.recorded_steps = 0  # the last step the spans reach (the end may say more)
        self.series = {name: _Series() for name in ("step_time_ms", "samples_per_s", "b_simple")}
        self.util_series: dict[int, _Series] = {}
        self.phases = PhaseTotals()

    # -- lines --------------------------------------------------------------------------------

    def add(self, item: object) -> None:
        if isinstance(item, Span):
            self._span(item)
        elif isinstance(item, Event):
            self._event(item)
        elif isinstance(item, Status):
            self.gpu_reason = None if item.gpu.available else item.gpu.reason
            if not item.noise_scale.available:
                self.noise_reason = item.noise_scale.reason
            self.noise_source = item.noise_scale.reason
            self.last_t = max(self.last_t, item.t)
        elif isinstance(item, ProbeLine):
            self._probe(item)
        elif isinstance(item, End):
            self.end = item
            self.recorded_steps = self.steps
            self.last_t = max(self.last_t, item.t)
            self.steps = max(self.steps, item.step)
            self.samples = max(self.samples, item.samples)

    def _span(self, span: Span) -> None:
        self.last_t = max(self.last_t, span.t1)
        self.resolution_s = max(self.resolution_s, span.t1 - span.t0)
        self.steps = max(self.steps, span.step)
        self.samples = max(self.samples, span.samples)
        self.timed_steps += span.timed_steps
        self.timed_s += span.timed_s
        self.timed_samples += span.timed_samples
        self.uncounted_s += span.uncounted_s
        self.eval_s += span.eval_s
        self.step_time = merge_stat(self.step_time, span.step_time)
        self.throughput = merge_stat(self.throughput, span.throughput)
        if span.tokens is not None and span.tokens > (self.tokens or 0):
            self.tokens, self.tokens_samples = span.tokens, span.samples
        self.mfu = merge_stat(self.mfu, span.mfu)
        add_counts(self.hist, span.step_hist)
        for device in span.devices:
            old = self.devices.get(device.index)
            self.devices[device.index] = device if old is None else merge_devices(old, device)
            if device.util is not None:
                series = self.util_series.setdefault(device.index, _Series())
                series.add(span.t1 - self.start, device.util.mean, device.util.n)
        if span.host is not None:
            self.cpu = merge_stat(self.cpu, span.host.cpu)
            self.rss = merge_stat(self.rss, span.host.rss)
        for name, stat in span.scalars.items():
            old = self.scalars.get(name)
            if old is None:  # the first value, where the record has it (else its span's mean)
                first = span.first.get(name, stat.mean)
                self.scalars[name] = (stat, first, stat.mean)
            else:
                self.scalars[name] = (merge_stat(old[0], stat), old[1], stat.mean)  # type: ignore[assignment]
        if span.noise_steps is not None:
            self.noise_steps = span.noise_steps
            self.noise_at_least = span.b_simple_at_least
        if span.b_simple is not None:
            self.noise = merge_stat(self.noise, span.b_simple)
            if self.noise_first is None:
                self.noise_first = span.b_simple.mean
            self.noise_last = span.b_simple.mean
            self.series["b_simple"].add(span.step, span.b_simple.mean, span.b_simple.n)
        if span.timed_steps:
            self.series["step_time_ms"].add(
                span.step, 1e3 * span.timed_s / span.timed_steps, span.timed_steps
            )
        if span.timed_steps:  # None: no counted samples, a corrupt span, or a coarse clock
            self.series["samples_per_s"].add(span.step, span_throughput(span), span.timed_steps)
        self._scalar_series(span)
        if span.phases is not None:
            self.phases = self.phases.merged(span.phases)
        if span.steps:
            self._batch(span)

    def _scalar_series(self, span: Span) -> None:
        name = chart_scalar(self.scalars)
        if name is not None and name in span.scalars:
            stat = span.scalars[name]
            self.series.setdefault(f"scalar:{name}", _Series()).add(span.step, stat.mean, stat.n)

    def _batch(self, span: Span) -> None:
        seg = self.segments[-1] if self.segments else None
        same = seg is not None and _segment_key(seg) == (span.batch_size, bool(span.batch_range))
        if not same:
            if len(self.segments) >= MAX_SEGMENTS:
                self.segments_left_out += 1
                seg = None
            else:
                seg = _Segment(span.batch_size, span.step - span.steps + 1, span.t0)
                self.segments.append(seg)
        if seg is not None:
            seg.varies = merge_range(seg.varies, span.batch_range)
            seg.to_step, seg.t1 = span.step, span.t1
            seg.steps += span.steps
            seg.timed_steps += span.timed_steps
            seg.timed_s += span.timed_s
            seg.timed_samples += span.timed_samples
            seg.uncounted_s += span.uncounted_s
        self._size_totals(span)

    def _size_totals(self, span: Span) -> None:
        totals = self.sizes.setdefault((span.batch_size, bool(span.batch_range)), _SizeTotals())
        totals.varies = merge_range(totals.varies, span.batch_range)
        totals.steps += span.steps
        if self.probe_runs.shared(span.t0, span.t1):
            totals.left_out_steps += span.steps
            totals.left_out_s += span.timed_s
            return
        totals.timed_s += span.timed_s
        totals.timed_samples += span.timed_samples
        totals.uncounted_s += span.uncounted_s
        if span.throughput is not None:
            totals.best = max(totals.best or 0.0, span.throughput.max)
        totals.windows.add(span.timed_samples, span.timed_s - span.uncounted_s)
        add_counts(totals.hist, span.step_hist)

    def _event(self, event: Event) -> None:
        self.last_t = max(self.last_t, event.t)
        self.probe_runs.see(event)
        if event.kind == "noise_scale" and event.level == "warning":
            reason = _noise_reason(event.message)
            self.noise_reason = self.noise_reason or reason
            if event.message.startswith(NOISE_OFF):  # turned off for good, perhaps after one
                self.noise_off = reason
        elif event.kind == "noise_scale" and event.message.startswith(WARMUP_ENDED):
            self.noise_warmup = event.message.removeprefix(WARMUP_ENDED)
        elif event.kind in ("autopilot", "autopilot_state"):
            self._autopilot_event(event)
        elif event.kind == "advice" and isinstance(event.data.get("advice"), dict):
            self._advice_event(event)
        elif event.kind == "loss_units":
            self.scalar_notes.update(event.data)
        elif event.kind == "loss_recovered":
            self._loss_recovered(event)
        self.events["total"] += 1
        self.events[event.level] = self.events.get(event.level, 0) + 1
        if event.level in ("warning", "error") and len(self.event_notes) < MAX_LISTED:
            if event.kind == "loss_diverged" and isinstance(event.data.get("change_step"), int):
                self.divergences[event.data["change_step"]] = len(self.event_notes)
            note = Note(event.kind, event.message, event.step, _round(event.t - self.start))
            self.event_notes.append(note)

    def _loss_recovered(self, event: Event) -> None:
        """The loss came back after a change it had diverged after: the divergence's warning
        gives way to the recovery, which says both (and advises no checkpoint)."""
        at = self.divergences.pop(event.data.get("change_step"), None)
        if at is not None:
            t_s = _round(event.t - self.start)
            self.event_notes[at] = Note(event.kind, event.message, event.step, t_s)

    def _autopilot_event(self, event: Event) -> None:
        autopilot = self.autopilot = self.autopilot or Autopilot(decisions=[], said=[])
        if event.kind == "autopilot" and isinstance(event.data.get("decision"), dict):
            if len(autopilot.decisions) < MAX_LISTED:
                autopilot.decisions.append(event.data["decision"])
        elif len(autopilot.said) < MAX_LISTED or event.data.get("end"):  # its last word stays
            note = Note(event.kind, event.message, event.step, _round(event.t - self.start))
            autopilot.said.append(note)
        if event.data.get("end"):
            autopilot.claimed_gain = event.data.get("claimed_gain")
            autopilot.start_size = event.data.get("start_size")

    def _advice_event(self, event: Event) -> None:
        """The advisor's answers: each said as the run went, and its final word."""
        word = self.final_word = self.final_word or FinalWord(advice={}, said=[])
        word.advice, word.ended_without = event.data["advice"], not event.data.get("final")
        if not event.data.get("final") and len(word.said) < MAX_LISTED:
            advice = event.data["advice"]
            said = advice.get("headline") or event.message
            said += f" ({advice['why']})" if advice.get("why") else ""
            word.said.append(Note("advice", said, event.step, _round(event.t - self.start)))

    def _probe(self, probe: ProbeLine) -> None:
        self.last_t = max(self.last_t, probe.t)
        if len(self.probes) < MAX_LISTED:
            self.probes.append(
                {"t_s": _round(probe.t - self.start), "step": probe.step, **probe.result}
            )
        else:
            self.probes_left_out += 1

    # -- the result ---------------------------------------------------------------------------

    def finish(
        self, torn: bool = False, unknown: int = 0, lines: int = 0, damaged: str | None = None
    ) -> Summary:
        self.source.torn_tail = torn
        self.source.lines = lines
        self.source.resolution_s = _round(self.resolution_s) if self.resolution_s else None
        end_time = self.end.t if self.end else self.last_t
        duration_s = max(0.0, end_time - self.start)
        summary = Summary(
            summary_version=SUMMARY_VERSION,
            generated=time.time(),
            source=self.source,
            run=self._run(end_time),
            duration_s=_round(duration_s),
            steps=self.steps,
            samples=self.samples if self.samples or not self.uncounted_s else None,
            step_time_s=self._step_time(),
            throughput=self._throughput(),
            devices=[self._device(d) for _, d in sorted(self.devices.items())],
            no_devices_reason=None
            if self.devices
            else (self.gpu_reason or "the job reported none"),
            host=Host(
                cpu_mean_percent=_round(self.cpu.mean) if self.cpu else None,
                rss_peak_bytes=int(self.rss.max) if self.rss else None,
            ),
            b_simple=self._noise(),
            batch_size_history=[self._segment(s) for s in self.segments],
            batch_sizes=[self._size(size, t) for (size, _), t in self.sizes.items()],
            scalars={
                name: Scalar(
                    stat.n,
                    _round(first),
                    _round(last),
                    stat.min,
                    stat.max,
                    _round(stat.mean),
                    self.scalar_notes.get(name),
                )
                for name, (stat, first, last) in self._scalars_at_end().items()
            },
            events=self.events,
            probes=self.probes,
            warnings=[],
            recommendations=[],
            series=self._series(),
            time=TimeSplit(
                steps_s=_round(self.timed_s),
                evaluation_s=_round(self.eval_s),
                other_s=_round(max(0.0, duration_s - self.timed_s - self.eval_s)),
            ),
        )
        summary.anatomy = self._anatomy(summary.devices)
        summary.autopilot = self.autopilot
        summary.final_word = self.final_word
        summary.warnings = self._warnings(summary, torn, unknown)
        if damaged is not None:
            summary.warnings.insert(0, Note("damaged_lines", damaged))
        summary.recommendations = recommendations(summary)
        return summary

    def _anatomy(self, devices: list[Device]) -> StepAnatomy | None:
        """The whole run's step anatomy and its verdict (GPU utilization: the busiest
        device's mean)."""
        utils = [d.util_mean_percent for d in devices if d.util_mean_percent is not None]
        session = self.header.session
        gpu_util = max(utils) if utils else None
        return judged(self.phases, session.world_size, gpu_util, session.ddp, session.fsdp2)

    def _run(self, end_time: float) -> Run:
        s = self.header.session
        return Run(
            name=s.name,
            pid=s.pid,
            host=s.host,
            argv=s.argv,
            cwd=s.cwd,
            python=s.python,
            torch_version=s.torch_version,
            bsmon_version=s.bsmon_version,
            rank=s.rank,
            world_size=s.world_size,
            start_time=s.start_time,
            end_time=end_time,
            start=iso(s.start_time),
            end=iso(end_time),
            complete=self.end is not None,
            end_reason=self.end.reason if self.end else None,
            recording_stopped=self.end.recording_stopped if self.end else None,
        )

    def _step_time(self) -> StepTime:
        p50, p95, p99 = quantiles(self.hist, (0.5, 0.95, 0.99), step_bin_value)
        st = self.step_time
        clamp = (
            (lambda v: None if v is None else _round(min(max(v, st.min), st.max))) if st else _round
        )
        return StepTime(
            timed_steps=self.timed_steps,
            mean=_round(self.timed_s / self.timed_steps) if self.timed_steps else None,
            p50=clamp(p50),
            p95=clamp(p95),
            p99=clamp(p99),
            min=_round(st.min) if st else None,
            max=_round(st.max) if st else None,
        )

    def _throughput(self) -> Throughput:
        tp = self.throughput
        samples_per_s = throughput(self.timed_samples, self.timed_s, self.uncounted_s)
        tokens_per_s = None
        if samples_per_s and self.tokens and self.tokens_samples:
            # the tokens an example carried over the run, from the last count of both
            tokens_per_s = samples_per_s * self.tokens / self.tokens_samples
        return Throughput(
            samples_per_s=_round(samples_per_s),
            steps_per_s=_round(self.timed_steps / self.timed_s) if self.timed_s else None,
            best_samples_per_s=_round(tp.max) if tp else None,
            worst_samples_per_s=_round(tp.min) if tp else None,
            tokens=self.tokens,
            tokens_per_s=_round(tokens_per_s),
            mfu_mean=_round(self.mfu.mean) if self.mfu else None,
        )

    @staticmethod
    def _device(d: DeviceSpan) -> Device:
        (p95,) = quantiles(d.util_hist, (0.95,), float)
        peak = int(d.mem_used.max) if d.mem_used else None
        # the allocator's own peak sees between samples; a record from before it has none
        reserved = max((b for b in (d.torch_reserved, d.torch_reserved_peak) if b), default=None)
        return Device(
            index=d.index,
            name=d.name,
            readings=d.util.n if d.util else (d.mem_used.n if d.mem_used else 0),
            util_mean_percent=_round(d.util.mean) if d.util else None,
            util_p95_percent=p95,
            util_max_percent=d.util.max if d.util else None,
            memory_peak_bytes=peak,
            memory_total_bytes=d.mem_total,
            memory_peak_fraction=_round(peak / d.mem_total) if peak and d.mem_total else None,
            torch_peak_bytes=d.torch_peak,
            torch_reserved_peak_bytes=reserved,
            torch_reserved_peak_fraction=_round(reserved / d.mem_total)
            if reserved and d.mem_total
            else None,
            alloc_retries=d.alloc_retries,
            ooms=d.ooms,
            temperature_max_c=d.temperature.max if d.temperature else None,
            power_mean_w=_round(d.power.mean) if d.power else None,
        )

    def _scalars_at_end(self) -> dict[str, tuple[Stat, float, float]]:
        """Each scalar's stat, first and last value: the last as the end line has it (a record
        without one, or from before it was kept: the last span's mean)."""
        last = self.end.last if self.end is not None else {}
        return {
            name: (stat, first, last.get(name, mean))
            for name, (stat, first, mean) in self.scalars.items()
        }

    def _noise(self) -> NoiseScale:
        n = self.noise
        return NoiseScale(
            start=_round(self.noise_first),
            end=_round(self.noise_last),
            min=_round(n.min) if n else None,
            max=_round(n.max) if n else None,
            trajectory=self.series["b_simple"].points(),
            note=self.noise_off if self.noise_first is not None else self._noise_note(),
        )

    def _noise_note(self) -> str:
        if self.noise_reason:
            return self.noise_reason
        estimator = f" ({self.noise_source})" if self.noise_source else ""
        if self.noise_steps >= NOISE_STEPS_NEEDED:
            bound = f": B_simple ≥ {self.noise_at_least:,.3g}" if self.noise_at_least else ""
            return (
                f"no estimate yet after {self.noise_steps:,} measured steps: the gradient "
                f"is not yet resolved from the noise at this batch size{bound}{estimator}"
            )
        measured = f" ({self.noise_steps} so far)" if self.noise_steps else ""
        warmup = f"; {self.noise_warmup}" if self.noise_warmup else ""
        return f"not enough measured steps for an estimate{measured}{estimator}{warmup}"

    def _segment(self, s: _Segment) -> BatchSegment:
        return BatchSegment(
            batch_size=s.batch_size,
            from_step=s.from_step,
            to_step=s.to_step,
            start_s=_round(s.t0 - self.start),
            duration_s=_round(s.t1 - s.t0),
            steps=s.steps,
            samples_per_s=_round(throughput(s.timed_samples, s.timed_s, s.uncounted_s)),
            step_time_s=_round(s.timed_s / s.timed_steps) if s.timed_steps else None,
            varies=batch_varies(s.varies),
        )

    @staticmethod
    def _size(size: int | None, t: _SizeTotals) -> BatchSize:
        (p50,) = quantiles(t.hist, (0.5,), step_bin_value)
        return BatchSize(
            batch_size=size,
            steps=t.steps,
            duration_s=_round(t.timed_s + t.left_out_s),
            samples_per_s=_round(throughput(t.timed_samples, t.timed_s, t.uncounted_s)),
            best_samples_per_s=_round(t.best) if t.best is not None else None,
            step_time_p50_s=_round(p50),
            samples_per_s_se=_round(t.windows.se),
            varies=batch_varies(t.varies),
            left_out_steps=t.left_out_steps,
            left_out_s=_round(t.left_out_s) or 0.0,
        )

    def _series(self) -> dict[str, list[Point]]:
        out = {name: s.points() for name, s in self.series.items()}
        for index, series in sorted(self.util_series.items()):
            out[f"gpu{index}_util_percent"] = series.points()
        return {name: points for name, points in out.items() if points}

    def _warnings(self, summary: Summary, torn: bool, unknown: int) -> list[Note]:
        notes: list[Note] = []
        if self.end is None:
            notes.append(
                Note(
                    "incomplete",
                    "the record has no end: the job was killed, crashed, or is still running, "
                    "or its recording stopped (a full or read-only disk; bsmon said so then); "
                    f"this summary covers it up to step {summary.steps:,} "
                    f"({summary.duration_s:.0f} s in)",
                )
            )
        elif self.end.recording_stopped:
            notes.append(
                Note(
                    "recording_stopped",
                    f"{self.end.recording_stopped}; the job went on unrecorded to step "
                    f"{self.end.step:,} and ended ({self.end.reason}): the figures here cover "
                    f"it up to step {self.recorded_steps:,}",
                )
            )
        if torn:
            notes.append(
                Note(
                    "torn_line",
                    "the record's last line was cut short (killed mid-write, or a full disk); "
                    "left out",
                )
            )
        if unknown:
            notes.append(
                Note(
                    "unknown_lines",
                    f"{unknown} lines of types this bsmon does not know were skipped",
                )
            )
        if summary.steps and not self.timed_steps:
            notes.append(Note("untimed", "no step was timed, so there are no step-time figures"))
        if self.segments_left_out:
            notes.append(
                Note(
                    "segments", f"{self.segments_left_out} later batch-size changes are not listed"
                )
            )
        notes.extend(self.event_notes)
        left_out = self.events["warning"] + self.events["error"] - len(self.event_notes)
        if left_out > 0:
            notes.append(
                Note("more_events", f"{left_out} more warnings and errors are in the record")
            )
        return notes


def chart_scalar(scalars: dict[str, Any]) -> str | None:
    """The scalar the charts show: ``loss`` when there is one, else the first logged."""
    if "loss" in scalars:
        return "loss"
    return next(iter(scalars), None)


def iso(t: float) -> str:
    return datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


def _round(value: float | None, digits: int = 6) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.{digits}g}")


# -- entry points ---------------------------------------------------------------------------------


def mark_running(summary: Summary) -> None:
    """A summary exported while the job runs (the monitor knows it): say so, instead of the
    record's missing end reading as a killed job."""
    summary.run.running = True
    summary.warnings = [
        Note(
            "running",
            f"the job is still running: this summary covers it up to step {summary.steps:,} "
            f"({summary.duration_s or 0:.0f} s in)",
        )
        if note.kind == "incomplete"
        else note
        for note in summary.warnings
    ]


def summarize_items(header: Header, source: Source, items: Iterable[object]) -> Summary:
    builder = SummaryBuilder(header, source)
    for item in items:
        builder.add(item)
    return builder.finish()


def summarize(reader: RecordReader) -> Summary:
    source = Source(kind="record", path=str(reader.path), record_version=reader.header.version)
    builder = SummaryBuilder(reader.header, source)
    for item in reader.lines():
        builder.add(item)
    return builder.finish(
        torn=reader.torn,
        unknown=reader.unknown,
        lines=reader.line_count,
        damaged=reader.damage_note(),
    )


def summarize_record(path: Path | str) -> Summary:
    with open_record(path) as reader:
        return summarize(reader)


def write_summary(
    summary: Summary, json_path: Path, md_path: Path, private: bool = False
) -> tuple[Path, Path]:
    """Write both files (atomically); ``private``: 0600, like the record they sit beside."""
    from .markdown import render_markdown

    mode = 0o600 if private else 0o666  # less the umask
    json_path.parent.mkdir(parents=True, exist_ok=True)
    encoded = msgspec.json.format(msgspec.json.encode(summary), indent=2) + b"\n"
    replace_atomically(json_path, encoded, mode)
    replace_atomically(md_path, render_markdown(summary).encode(), mode)
    return json_path, md_path


def export_record(record: Path | str, out_dir: Path | str) -> tuple[Path, Path]:
    """``summary.json`` and ``summary.md`` of ``record`` in ``out_dir``."""
    out = Path(out_dir)
    return write_summary(summarize_record(record), out / "summary.json", out / "summary.md")


def paths_beside(record: Path) -> tuple[Path, Path]:
    """Where the end-of-job summary of ``record`` goes: ``<stem>.summary.json`` and ``.md``."""
    stem = record.name.removesuffix(".jsonl")
    return record.with_name(f"{stem}.summary.json"), record.with_name(f"{stem}.summary.md")


def write_summary_beside(record: Path) -> tuple[Path, Path]:
    return write_summary(summarize_record(record), *paths_beside(record), private=True)


def preload() -> None:
    """Import the summary's writer (and plotext) now, early in the job: importing plotext
    during interpreter shutdown turns an exit by Ctrl-C (status 130) into status 1."""
    from . import markdown  # noqa: F401
