"""``summary.md``: the summary for a person (its charts: ``text_charts``)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from ..anatomy.sampling import DEFAULT_STRIDE
from ..anatomy.verdict import MIN_STEPS
from .figures import count, duration, gib, ms, num, pct, rate
from .final_word import final_word_section
from .schema import BatchSegment, BatchSize, Device, Note, Run, Summary, Throughput
from .text_charts import charts_section


def render_markdown(s: Summary) -> str:
    parts = [
        f"# bsmon summary: {s.run.name}\n\n{_story(s)}\n",
        final_word_section(s),
        _run_table(s),
        _numbers_table(s),
        _devices(s),
        _anatomy(s),
        _batch_sizes(s),
        _autopilot(s),
        charts_section(s),
        _scalars(s),
        _probes(s),
        _notes("Warnings", s.warnings, "none"),
        _notes("Recommendations", s.recommendations, "none: nothing stood out in this run"),
        f"---\n\nMade by bsmon from {_code(s.source.path or 'a dashboard session')}; "
        "the numbers are in summary.json (schema: docs/summary.md).\n",
    ]
    return "\n".join(p for p in parts if p)


# -- sections ---------------------------------------------------------------------------------


def _story(s: Summary) -> str:
    ending = _ending(s.run)
    return (
        f"**{s.run.name}** ran **{duration(s.duration_s)}** on {s.run.host} (pid {s.run.pid}): "
        f"**{s.steps:,} steps**, {_samples(s)}; {ending}."
    )


def _ending(run: Run) -> str:
    if run.running:
        return "still running when this was exported"
    if not run.complete:
        return "no end line (killed, crashed, or its recording stopped early)"
    if run.recording_stopped:
        return f"ended: {run.end_reason}, but its recording had stopped early"
    return f"ended: {run.end_reason}"


def _samples(s: Summary) -> str:
    return f"{count(s.samples)} samples" if s.samples is not None else "samples not counted"


def _token_rows(tp: Throughput) -> list[tuple[str, str]]:
    """A sequence model's tokens/s and MFU, where the job had them."""
    rows = []
    if tp.tokens_per_s is not None:
        rows.append(("tokens", f"{rate(tp.tokens_per_s)} tokens/s ({tp.tokens:,} trained)"))
    if tp.mfu_mean is not None:
        rows.append(("MFU", f"{100 * tp.mfu_mean:.1f}% mean (model FLOPs over the device's peak)"))
    return rows


def _time_split(s: Summary) -> str:
    t = s.time
    evaluation = f" · evaluation {duration(t.evaluation_s)}" if t.evaluation_s else ""
    return f"steps {duration(t.steps_s)}{evaluation} · other {duration(t.other_s)}"


def _table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _run_table(s: Summary) -> str:
    run = s.run
    end = run.end if run.complete else f"{run.end} (last record; no end line)"
    if run.running:
        end = f"{run.end} (the last record so far: the job is still running)"
    rank = [("rank", f"{run.rank} of {run.world_size}")] if run.world_size > 1 else []
    rows = [
        ("command", _code(shlex.join(run.argv) if run.argv else "?")),
        ("directory", _code(run.cwd or "?")),
        ("started", run.start),
        ("ended", end),
        *rank,
        (
            "versions",
            f"python {run.python} · torch {run.torch_version} · bsmon {run.bsmon_version}",
        ),
    ]
    return "## Run\n\n" + _table(rows, ("", ""))


def _numbers_table(s: Summary) -> str:
    st, tp, noise = s.step_time_s, s.throughput, s.b_simple
    step_time = (
        f"mean {ms(st.mean)} · p50 {ms(st.p50)} · p95 {ms(st.p95)} · p99 {ms(st.p99)} "
        f"(min {ms(st.min)}, max {ms(st.max)}; {st.timed_steps:,} steps timed)"
    )
    rows = [
        ("duration", duration(s.duration_s)),
        ("steps", f"{s.steps:,}"),
        ("samples", f"{s.samples:,}" if s.samples is not None else "n/a (not counted)"),
        ("time", _time_split(s)),
        ("step time", step_time if st.timed_steps else "n/a (no step was timed)"),
        (
            "throughput",
            f"{rate(tp.samples_per_s)} samples/s (best half second {rate(tp.best_samples_per_s)}, "
            f"worst {rate(tp.worst_samples_per_s)})",
        ),
        *_token_rows(tp),
        (
            "B_simple (estimate)",
            f"{num(noise.start)} at the start → {num(noise.end)} at the end "
            f"(range {num(noise.min)}–{num(noise.max)})"
            if noise.end is not None
            else f"n/a ({noise.note or 'not measured'})",
        ),
    ]
    if s.host.rss_peak_bytes is not None:
        rows.append(
            (
                "job process",
                f"CPU {pct(s.host.cpu_mean_percent)} mean · RSS peak {gib(s.host.rss_peak_bytes)}",
            )
        )
    return "## Numbers\n\n" + _table(rows, ("", ""))


def _devices(s: Summary) -> str:
    if not s.devices:
        return f"## Devices\n\nno GPU readings: {s.no_devices_reason}.\n"
    rows = [
        (
            f"GPU{d.index}",
            d.name or "?",
            pct(d.util_mean_percent),
            pct(d.util_p95_percent),
            f"{gib(d.memory_peak_bytes)} of {gib(d.memory_total_bytes)} "
            f"({pct(_percent_of(d.memory_peak_fraction))})",
            gib(d.torch_peak_bytes),
            f"{gib(d.torch_reserved_peak_bytes)} "
            f"({pct(_percent_of(d.torch_reserved_peak_fraction))})",
            _allocator_trouble(d),
            f"{d.temperature_max_c:.0f} °C" if d.temperature_max_c is not None else "n/a",
            f"{d.power_mean_w:.0f} W" if d.power_mean_w is not None else "n/a",
        )
        for d in s.devices
    ]
    header = (
        "device",
        "name",
        "util mean",
        "util p95",
        "memory peak",
        "torch peak",
        "reserved peak",
        "retries · OOMs",
        "temp max",
        "power mean",
    )
    return "## Devices\n\n" + _table(rows, header)


def _allocator_trouble(d: Device) -> str:
    """The allocator's cudaMalloc retries and OOMs (n/a from a record made before they were
    read)."""
    if d.alloc_retries is None and d.ooms is None:
        return "n/a"
    return f"{d.alloc_retries or 0} · {d.ooms or 0}"


PHASE_NAMES = {
    "data": "waiting for data",
    "forward": "forward (and loss)",
    "backward": "backward",
    "comm": "all-reduce wait",
    "optimizer": "optimizer step",
    "other": "other (logging, syncs, zero_grad)",
}


def _anatomy(s: Summary) -> str:
    a = s.anatomy
    if a is None or not a.step_s:
        return ""
    rows = []
    for phase, name in PHASE_NAMES.items():
        seconds = getattr(a, f"{phase}_s")
        share = pct(100 * seconds / a.step_s) if seconds is not None else "not measured"
        rows.append((name, ms(seconds), share))
    low, high = DEFAULT_STRIDE
    if a.verdict:
        verdict = f"**{a.verdict}**: {a.evidence}; try: {a.advice}.\n\n"
    else:
        verdict = (
            f"No verdict: {a.steps:,} steps were split, and a verdict needs {MIN_STEPS} "
            f"(bsmon splits one step in {low} to {high}: a longer run gets one).\n\n"
        )
    notes = "".join(f"- {note}\n" for note in a.notes)
    return (
        f"## Where the step time went\n\n{verdict}"
        f"Per step, averaged over {a.steps:,} sampled steps ({a.clock or 'wall clock'}):\n\n"
        + _table(rows, ("phase", "per step", "share"))
        + (f"\n{notes}" if notes else "")
    )


def _batch_sizes(s: Summary) -> str:
    if not s.batch_size_history:
        return "## Batch size\n\nno steps were recorded.\n"
    history = _table(
        [
            (
                seg.varies or _size(seg.batch_size),
                f"{seg.from_step:,}–{seg.to_step:,}",
                duration(seg.duration_s),
                rate(seg.samples_per_s),
                ms(seg.step_time_s),
            )
            for seg in s.batch_size_history
        ],
        ("batch size", "steps", "time", "samples/s", "step time"),
    )
    by_size = _table(
        [
            (
                b.varies or _size(b.batch_size),
                f"{b.steps:,}",
                duration(b.duration_s),
                rate(b.samples_per_s)
                + (f" ± {rate(b.samples_per_s_se)}" if b.samples_per_s_se is not None else ""),
                rate(b.best_samples_per_s),
                ms(b.step_time_p50_s),
            )
            for b in sorted(s.batch_sizes, key=lambda b: b.batch_size or 0)
        ],
        ("batch size", "steps", "time", "samples/s (± SE)", "best samples/s", "step time p50"),
    )
    return (
        f"## Batch size\n\nIn order:\n\n{history}{_first_step_note(s.batch_size_history)}"
        f"\nWhat each size reached:\n\n{by_size}{_left_out_note(s.batch_sizes)}"
    )


def _left_out_note(sizes: list[BatchSize]) -> str:
    """The steps the per-size figures leave out, and why: a probe's sidecar shared the job's
    device then (the live verdicts leave out the same windows)."""
    parts = [
        f"{b.left_out_steps:,} steps at {b.varies or _size(b.batch_size)} "
        f"({duration(b.left_out_s)})"
        for b in sorted(sizes, key=lambda b: b.batch_size or 0)
        if b.left_out_steps
    ]
    if not parts:
        return ""
    return (
        f"\nLeft out of samples/s, best and step time p50: {' and '.join(parts)}, run while a "
        "probe's sidecar shared the job's device (they measure the job beside the sidecar, "
        "not the batch size).\n"
    )


def _first_step_note(history: list[BatchSegment]) -> str:
    """Why the first step's size is n/a when the steps after it have one: a job that cuts its
    batches by hand is counted from its second step (docs/zero-code.md)."""
    first = history[0]
    if len(history) == 1 or (first.batch_size, first.from_step, first.to_step) != (None, 1, 1):
        return ""
    return (
        "\nStep 1 is n/a: a job that makes its batches itself (no DataLoader) has its samples "
        "counted from the model's input from the second step on.\n"
    )


def _autopilot(s: Summary) -> str:
    autopilot = s.autopilot
    if autopilot is None:
        return ""
    if autopilot.claimed_gain is not None:
        claim = (
            f"It claims **{autopilot.claimed_gain:.2f}×** the progress per second of a fixed "
            f"batch of {autopilot.start_size}, the size it was switched on at, over the steps it "
            "drove (measured throughput at each size × the noise scale's efficiency; its end "
            "line below names each span).\n\n"
        )
    else:
        claim = ""
    rows = [
        (
            f"{d.get('step', 0):,}",
            f"{d.get('old')} → {d.get('new')}",
            d.get("kind", ""),
            num(d.get("b_simple")),
            f"[{num(d.get('b_simple_low'))}, {num(d.get('b_simple_high'))}]"
            if d.get("b_simple_low") is not None
            else "",
            num(d.get("half_batch")),
            _size(d.get("target")),
            f"{d['predicted_gain']:.2f}×" if d.get("predicted_gain") else d.get("note", ""),
        )
        for d in autopilot.decisions
    ]
    header = ("step", "batch", "", "B_simple", "95% interval", "B½", "target", "predicted")
    decisions = _table(rows, header) if rows else "It made no change.\n"
    said = "".join(f"- step {n.step:,}: {n.message}\n" for n in autopilot.said)
    return f"## Autopilot\n\n{claim}{decisions}\n{said}"


def _scalars(s: Summary) -> str:
    if not s.scalars:
        return ""
    named = {f"{_code(k)} ({v.note})" if v.note else _code(k): v for k, v in s.scalars.items()}
    rows = [
        (name, num(v.first), num(v.last), num(v.min), num(v.max), f"{v.n:,}")
        for name, v in named.items()
    ]
    return "## Logged scalars\n\n" + _table(rows, ("name", "first", "last", "min", "max", "values"))


def _probes(s: Summary) -> str:
    if not s.probes:
        return ""
    lines = [
        f"- step {p.get('step', 0):,} ({duration(p.get('t_s'))} in): {probe_text(p)}"
        for p in s.probes
    ]
    return "## Probe results\n\n" + "\n".join(lines) + "\n"


def probe_text(probe: dict) -> str:
    """The sidecar probe's result in a sentence; other results as their plain fields."""
    if "status" not in probe:
        return ", ".join(f"{k}={v}" for k, v in probe.items() if k not in ("t_s", "step"))
    parts = [str(probe["status"])]
    if probe.get("max_batch_size"):
        parts.append(f"largest batch that ran {probe['max_batch_size']:,}")
    if probe.get("predicted_max"):
        parts.append(f"predicted max ≈ {probe['predicted_max']:,} (a prediction)")
    if probe.get("confirmation"):
        parts.append(str(probe["confirmation"]))
    recommendation = probe.get("recommendation")
    if isinstance(recommendation, dict) and recommendation.get("batch_size"):
        reasons = "; ".join(recommendation.get("reasons") or [])
        parts.append(
            f"recommended {recommendation['batch_size']:,}" + (f" ({reasons})" if reasons else "")
        )
    if probe.get("points"):
        parts.append(f"{len(probe['points'])} sizes measured on {probe.get('device', '?')}")
    if probe.get("error"):
        parts.append(f"error: {probe['error']}")
    return " · ".join(parts)


def _notes(title: str, notes: list[Note], empty: str) -> str:
    if not notes:
        return f"## {title}\n\n{empty}.\n"
    lines = [f"- {note.message}{_where(note)}" for note in notes]
    return f"## {title}\n\n" + "\n".join(lines) + "\n"


# -- numbers for people ---------------------------------------------------------------------------


def _code(text: str) -> str:
    return "`" + text.replace("`", "'") + "`"


def _size(value: int | None) -> str:
    return f"{value:,}" if value is not None else "n/a"


def _where(note: Note) -> str:
    """Where a note stands: " (step 8,984, 2m 41s in)", or its step alone when its time is not
    known."""
    if note.step is None:
        return ""
    when = f", {duration(note.t_s)} in" if note.t_s is not None else ""
    return f" (step {note.step:,}{when})"


def _percent_of(fraction: float | None) -> float | None:
    return None if fraction is None else 100 * fraction
