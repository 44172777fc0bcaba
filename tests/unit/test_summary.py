"""The summary's numbers against a record whose values are known, and its two renderings."""

from __future__ import annotations

import json
import math
import random
import statistics
import time

import msgspec
import pytest

from bsmon.probes.record.buckets import compact, step_bin
from bsmon.probes.record.format import (
    End,
    ProbeLine,
    Span,
    Status,
    encode_line,
    header_for,
    line_decoder,
)
from bsmon.probes.summary.build import export_record, summarize_record
from bsmon.probes.summary.schema import Summary
from bsmon.probes.wire.describe import describe_advice
from bsmon.probes.wire.protocol import Advice, Capability, Event

from ..records import GIB, START, make_span, session, two_phase


def nearest_rank(values, q):
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


@pytest.fixture
def synthetic():
    return two_phase()


@pytest.fixture
def summary(synthetic, tmp_path):
    return summarize_record(synthetic.write(tmp_path / "r.jsonl"))


def test_run_info_steps_samples_and_duration(summary, synthetic):
    assert summary.steps == synthetic.steps == 1500
    assert summary.samples == synthetic.samples == 100 * 10 * 32 + 50 * 10 * 64
    assert summary.duration_s == pytest.approx(150 * 0.5)
    run = summary.run
    assert (run.name, run.pid, run.host, run.complete, run.end_reason) == (
        "synthetic",
        4242,
        "gpu-box-7",
        True,
        "closed",
    )
    assert run.argv == ["train.py", "--lr", "0.1"] and run.start_time == START


def test_step_time_mean_and_percentiles(summary, synthetic):
    times = synthetic.all_step_times
    st = summary.step_time_s
    assert st.timed_steps == len(times) == 1500
    assert st.mean == pytest.approx(statistics.fmean(times), rel=1e-5)
    assert st.min == pytest.approx(0.010) and st.max == pytest.approx(0.029)
    for q, got in ((0.5, st.p50), (0.95, st.p95), (0.99, st.p99)):
        assert got == pytest.approx(nearest_rank(times, q), rel=0.011), q
    assert (st.p50, st.p95, st.p99) == pytest.approx((0.017, 0.028, 0.029), rel=0.011)


def test_throughput_overall_and_per_batch_size(summary, synthetic):
    total_time = sum(synthetic.all_step_times)
    approx = lambda value: pytest.approx(value, rel=1e-5)  # noqa: E731 - six digits are kept
    assert summary.throughput.samples_per_s == approx(synthetic.samples / total_time)
    assert summary.throughput.steps_per_s == approx(1500 / total_time)
    phase1 = 32 * 10 / sum(0.010 + 0.001 * i for i in range(10))
    phase2 = 64 * 10 / sum(0.020 + 0.001 * i for i in range(10))
    assert phase2 > phase1
    assert summary.throughput.best_samples_per_s == approx(phase2)
    assert summary.throughput.worst_samples_per_s == approx(phase1)

    first, second = summary.batch_size_history
    assert (first.batch_size, first.from_step, first.to_step, first.steps) == (32, 1, 1000, 1000)
    assert (second.batch_size, second.from_step, second.to_step, second.steps) == (
        64,
        1001,
        1500,
        500,
    )
    assert first.samples_per_s == approx(phase1)
    assert second.samples_per_s == approx(phase2)
    assert first.start_s == 0 and second.start_s == pytest.approx(50.0)
    assert first.duration_s == pytest.approx(50.0) and second.duration_s == pytest.approx(25.0)
    sizes = {b.batch_size: b for b in summary.batch_sizes}
    assert sizes[32].samples_per_s == approx(phase1)
    assert sizes[64].best_samples_per_s == approx(phase2)
    assert sizes[32].step_time_p50_s == pytest.approx(0.014, rel=0.011)


def test_devices_host_noise_scale_and_scalars(summary, synthetic):
    (gpu,) = summary.devices
    assert gpu.name == "NVIDIA H100 80GB HBM3" and gpu.readings == 150
    assert gpu.util_mean_percent == pytest.approx(statistics.fmean(synthetic.utils))
    assert gpu.util_p95_percent == nearest_rank(synthetic.utils, 0.95)
    assert gpu.util_max_percent == max(synthetic.utils)
    assert gpu.memory_peak_bytes == synthetic.mem_peak == 32 * GIB
    assert gpu.memory_total_bytes == 80 * GIB
    assert gpu.memory_peak_fraction == pytest.approx(32 / 80)
    assert gpu.torch_peak_bytes == 31 * GIB
    assert gpu.torch_reserved_peak_bytes == 32 * GIB - GIB // 2
    assert summary.no_devices_reason is None
    assert summary.host.rss_peak_bytes == 2 * GIB
    assert (summary.b_simple.start, summary.b_simple.end) == (100.0, 249.0)
    assert (summary.b_simple.min, summary.b_simple.max) == (100.0, 249.0)
    trajectory = summary.b_simple.trajectory
    assert 2 <= len(trajectory) <= 256 and trajectory[0][1] == pytest.approx(100.0, abs=1)
    loss = summary.scalars["loss"]
    assert (loss.first, loss.last, loss.max) == pytest.approx((2.0, 2.0 / 150, 2.0), rel=1e-5)


def test_events_probes_warnings_and_recommendations(summary):
    assert summary.events == {"total": 3, "info": 1, "warning": 2, "error": 0}
    assert [w.kind for w in summary.warnings] == ["slow_phase", "slow_phase"]
    assert summary.warnings[0].step == 1000
    assert summary.probes == [{"t_s": 75.0, "step": 1500, "max_batch_size": 512}]
    kinds = {r.kind for r in summary.recommendations}
    # batch 64 is well below B_simple ~249; memory peaked at 40%; two sizes were used
    assert {"batch_below_noise_scale", "memory_headroom", "fastest_batch_size"} <= kinds
    assert all(
        "estimate" in r.message or "prediction" in r.message or "measured" in r.message
        for r in summary.recommendations
        if r.kind != "low_gpu_utilization"
    )


def test_compacted_record_gives_the_same_numbers(synthetic, tmp_path):
    """Downsampling keeps min/mean/max and histograms exact, so the summary does not move."""
    whole = summarize_record(synthetic.write(tmp_path / "whole.jsonl"))
    lines = synthetic.lines()
    items = [line_decoder.decode(line) for line in lines[1:]]
    compacted = list(compact(items, start=START, now=synthetic.stop, bucket_s=0.5, per_level=8))
    assert sum(isinstance(i, Span) for i in compacted) < len(synthetic.spans) / 3
    path = tmp_path / "compacted.jsonl"
    path.write_bytes(lines[0] + b"".join(msgspec.json.encode(i) + b"\n" for i in compacted))
    small = summarize_record(path)
    for field in ("steps", "samples", "duration_s"):
        assert getattr(small, field) == getattr(whole, field)
    assert small.step_time_s == whole.step_time_s
    assert small.throughput == whole.throughput
    assert small.devices == whole.devices
    assert [(s.batch_size, s.from_step, s.to_step) for s in small.batch_size_history] == [
        (s.batch_size, s.from_step, s.to_step) for s in whole.batch_size_history
    ]
    assert small.source.resolution_s > whole.source.resolution_s


def test_export_writes_json_that_matches_the_schema_and_markdown_with_charts(synthetic, tmp_path):
    json_path, md_path = export_record(synthetic.write(tmp_path / "r.jsonl"), tmp_path / "out")
    assert (json_path.name, md_path.name) == ("summary.json", "summary.md")
    data = json.loads(json_path.read_text())
    assert data["steps"] == 1500 and data["summary_version"] == 1
    msgspec.convert(data, Summary)  # the documented schema, exactly
    md = md_path.read_text()
    assert md.startswith("# bsmon summary: synthetic")
    assert "**1,500 steps**" in md and "p50 17" in md and "| 64 | 1,001–1,500 |" in md
    for heading in (
        "## Run",
        "## Numbers",
        "## Devices",
        "## Batch size",
        "## Charts",
        "## Warnings",
        "## Recommendations",
        "## Probe results",
    ):
        assert heading in md
    assert "step time (ms) by step" in md and "loss by step" in md and "GPU0 utilization" in md
    assert "⠀" in md or "⣀" in md  # braille text charts from plotext
    assert "\x1b[" not in md  # no terminal colour codes


def test_a_cpu_run_without_steps_still_summarizes(tmp_path):
    reason = "torch 2.13.0+cpu is a CPU-only build"
    lines = [
        encode_line(header_for(session(), 8, START)),
        encode_line(Status(t=START, gpu=Capability(False, reason), noise_scale=Capability(False))),
        *(encode_line(Span(t0=START + k, t1=START + k + 1, step=0)) for k in range(3)),
        encode_line(End(t=START + 3, reason="closed", step=0, samples=0)),
    ]
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"".join(lines))
    json_path, md_path = export_record(path, tmp_path)
    summary = msgspec.json.decode(json_path.read_bytes(), type=Summary)
    assert summary.steps == 0 and summary.duration_s == 3.0
    assert summary.step_time_s.timed_steps == 0 and summary.step_time_s.p50 is None
    assert summary.throughput.samples_per_s is None and summary.batch_size_history == []
    assert summary.devices == [] and summary.no_devices_reason == reason
    assert summary.recommendations == []
    md = md_path.read_text()
    assert f"no GPU readings: {reason}" in md and "no steps were recorded" in md
    assert "none: nothing stood out" in md


def test_summary_code_imports_neither_textual_nor_torch_and_replay_no_torch():
    from .test_layout import imported_modules

    modules = imported_modules(
        "import bsmon.probes.summary.build, bsmon.probes.summary.markdown, "
        "bsmon.probes.record.reader"
    )
    assert not {m for m in modules if m.split(".")[0] in ("textual", "rich", "torch")}
    modules = imported_modules("import bsmon.tui.replay, bsmon.tui.export, bsmon.tui.cli.record")
    assert "torch" not in modules


def test_a_sidecar_probe_result_reads_as_a_sentence_and_its_recommendation_is_kept(tmp_path):
    from bsmon.probes.summary.markdown import probe_text

    synthetic = two_phase()
    lines = synthetic.lines()
    probe = {
        "status": "ok",
        "max_batch_size": 512,
        "predicted_max": 900,
        "device": "cuda:0",
        "points": [{"batch_size": 64, "fits": True}, {"batch_size": 512, "fits": True}],
        "recommendation": {"batch_size": 256, "reasons": ["near B_simple"]},
    }
    lines.insert(-1, encode_line(ProbeLine(t=START + 70, step=1400, result=probe)))
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"".join(lines))
    summary = summarize_record(path)
    assert probe_text(summary.probes[-1]) == (
        "ok · largest batch that ran 512 · predicted max ≈ 900 (a prediction) · "
        "recommended 256 (near B_simple) · 2 sizes measured on cuda:0"
    )
    (note,) = [r for r in summary.recommendations if r.kind == "probe_recommendation"]
    assert note.message == (
        "the probe at step 1,400 recommended batch size 256 (the advice then): near B_simple"
    )


def write_record(path, items) -> Summary:
    path.write_bytes(b"".join(encode_line(item) for item in items))
    json_path, _md = export_record(path, path.parent)
    return msgspec.json.decode(json_path.read_bytes(), type=Summary)


def timed_span(k: int, steps: int, *, samples: int | None, eval_s: float = 0.0) -> Span:
    """One second of ``steps`` 0.1 s steps; ``samples`` per step (None: not counted)."""
    timed_s = 0.1 * steps
    return Span(
        t0=START + k,
        t1=START + k + 1,
        step=steps * (k + 1),
        steps=steps,
        samples=(samples or 0) * steps * (k + 1),
        batch_size=samples,
        timed_steps=steps,
        timed_s=timed_s,
        timed_samples=(samples or 0) * steps,
        uncounted_s=timed_s if samples is None else 0.0,
        eval_s=eval_s,
        step_hist={step_bin(0.1): steps},
    )


def test_uncounted_samples_are_null_with_the_reason_never_zero(tmp_path):
    reason = "samples not counted: no DataLoader batch was seen and ..."
    summary = write_record(
        tmp_path / "r.jsonl",
        [
            header_for(session(), None, START),
            Event(t=START, step=1, kind="samples_not_counted", message=reason, level="warning"),
            *(timed_span(k, 5, samples=None) for k in range(3)),
            End(t=START + 3, reason="closed", step=15, samples=0),
        ],
    )
    assert summary.samples is None and summary.throughput.samples_per_s is None
    assert summary.step_time_s.timed_steps == 15 and summary.throughput.steps_per_s == 10
    assert any(w.message == reason for w in summary.warnings)
    md = (tmp_path / "summary.md").read_text()
    assert "samples not counted" in md and "n/a (not counted)" in md and " 0 samples" not in md


def test_evaluation_time_is_apart_and_the_time_adds_up(tmp_path):
    summary = write_record(
        tmp_path / "r.jsonl",
        [
            header_for(session(), 8, START),
            timed_span(0, 5, samples=8),
            timed_span(1, 2, samples=8, eval_s=0.6),  # a validation pass between two steps
            End(t=START + 2, reason="closed", step=14, samples=56),
        ],
    )
    assert summary.time.steps_s == pytest.approx(0.7)
    assert summary.time.evaluation_s == pytest.approx(0.6)
    assert summary.time.other_s == pytest.approx(2 - 0.7 - 0.6)
    assert summary.samples == 56 and summary.throughput.samples_per_s == pytest.approx(80)
    (size,) = summary.batch_sizes
    assert size.duration_s == pytest.approx(summary.time.steps_s)  # the sizes add up
    assert "evaluation 0.6 s" in (tmp_path / "summary.md").read_text()


def test_no_estimate_says_why_when_every_measured_step_was_skipped(tmp_path):
    skipped = (
        "noise scale: skipped step 3: the micro-batch estimator needs gradient accumulation "
        "(further skips are only counted)"
    )
    summary = write_record(
        tmp_path / "r.jsonl",
        [
            header_for(session(), 8, START),
            Event(t=START, step=3, kind="noise_scale", message=skipped, level="warning"),
            timed_span(0, 5, samples=8),
            End(t=START + 1, reason="closed", step=5, samples=40),
        ],
    )
    note = summary.b_simple.note
    assert (
        note
        == "measured steps were skipped (the micro-batch estimator needs gradient accumulation)"
    )
    assert note in (tmp_path / "summary.md").read_text()


def test_no_estimate_after_many_measured_steps_says_the_gradient_is_not_resolved(tmp_path):
    """A small batch against a large noise scale: 200 steps measured, |G|² still within its
    noise. The summary says that (and the bound), not that too few steps were measured."""
    early = msgspec.structs.replace(timed_span(0, 5, samples=12), noise_steps=5)
    late = msgspec.structs.replace(
        timed_span(1, 5, samples=12), noise_steps=200, b_simple_at_least=480.0
    )
    summary = write_record(
        tmp_path / "r.jsonl",
        [
            header_for(session(), 12, START),
            early,
            late,
            End(t=START + 2, reason="x", step=10, samples=120),
        ],
    )
    assert summary.b_simple.end is None
    assert summary.b_simple.note.startswith("no estimate yet after 200 measured steps")
    assert "B_simple ≥ 480" in summary.b_simple.note
    short = write_record(
        tmp_path / "s.jsonl",
        [header_for(session(), 12, START), early, End(t=START + 1, reason="x", step=5, samples=60)],
    )
    assert short.b_simple.note.startswith("not enough measured steps for an estimate (5 so far)")


def noisy_spans(rng, size: int, rate: float, spans: int, first: int) -> list[Span]:
    """``spans`` one-second spans of 10 steps at ``size``, their throughput ``rate`` ± 10%."""
    out = []
    for k in range(first, first + spans):
        timed_s = size * 10 / (rate * (1 + rng.gauss(0, 0.1)))
        out.append(
            Span(
                t0=START + k,
                t1=START + k + 1,
                step=10 * (k + 1),
                steps=10,
                samples=size * 10 * (k + 1),
                batch_size=size,
                timed_steps=10,
                timed_s=timed_s,
                timed_samples=size * 10,
                step_hist={step_bin(timed_s / 10): 10},
            )
        )
    return out


def test_each_sizes_throughput_has_its_standard_error_and_noise_names_no_fastest(tmp_path):
    rng = random.Random(7)
    spans = noisy_spans(rng, 32, 1000.0, 50, 0) + noisy_spans(rng, 64, 1000.0, 50, 50)
    summary = write_record(tmp_path / "r.jsonl", [header_for(session(), 32, START), *spans])
    sizes = {b.batch_size: b for b in summary.batch_sizes}
    for size in (32, 64):
        # 10% per span over 50 spans: about 1000 × 0.1 / √50 ≈ 14 samples/s
        assert sizes[size].samples_per_s_se == pytest.approx(14.1, rel=0.3)
    kinds = {r.kind for r in summary.recommendations}
    assert "no_fastest_batch_size" in kinds and "fastest_batch_size" not in kinds
    markdown = (tmp_path / "summary.md").read_text()
    assert "samples/s (± SE)" in markdown


def beside_a_probe() -> list:
    """The newcomer's demo: 64 at 5,200 samples/s, then 128 at 7,300 but for the 57 spans a
    probe's sidecar shared (80.2 s to 136.5 s in), when the job made 3,000. Events come before
    the span whose tick drained them, as the recorder writes them."""
    rng = random.Random(11)
    spans = [
        *noisy_spans(rng, 64, 5200.0, 60, 0),
        *noisy_spans(rng, 128, 7300.0, 20, 60),
        *noisy_spans(rng, 128, 3000.0, 57, 80),
        *noisy_spans(rng, 128, 7300.0, 43, 137),
    ]
    probe = [
        Event(t=START + 80.2, step=800, kind="probe_started", message="probe started"),
        Event(t=START + 136.5, step=1365, kind="probe_result", message="max batch 4,096"),
    ]
    return sorted([*spans, *probe], key=lambda item: getattr(item, "t1", getattr(item, "t", 0)))


def test_the_per_size_figures_leave_out_the_spans_a_probe_shared_and_say_so(tmp_path):
    items = beside_a_probe()
    summary = write_record(tmp_path / "r.jsonl", [header_for(session(), 64, START), *items])
    sizes = {b.batch_size: b for b in summary.batch_sizes}
    assert sizes[128].samples_per_s == pytest.approx(7300, rel=0.03)  # not 4,300 with the probe
    assert sizes[128].left_out_steps == 570 and sizes[128].steps == 1200
    assert sizes[128].left_out_s == pytest.approx(57 * 1280 / 3000, rel=0.05)
    assert sizes[64].left_out_steps == 0 and sizes[64].samples_per_s == pytest.approx(
        5200, rel=0.03
    )
    assert sum(b.duration_s for b in summary.batch_sizes) == pytest.approx(summary.time.steps_s)
    (fastest,) = [r for r in summary.recommendations if r.kind == "fastest_batch_size"]
    assert "128" in fastest.message and "measured over 630 steps" in fastest.message
    markdown = (tmp_path / "summary.md").read_text()
    assert "570 steps at 128" in markdown and "probe's sidecar shared" in markdown
    # compacted, merged spans that straddle the probe's ends are left out whole
    merged = list(compact(items, start=START, now=START + 180, bucket_s=0.5, per_level=8))
    small = write_record(tmp_path / "c.jsonl", [header_for(session(), 64, START), *merged])
    size = next(b for b in small.batch_sizes if b.batch_size == 128)
    assert size.left_out_steps >= 570 and size.samples_per_s == pytest.approx(7300, rel=0.03)


def test_a_summary_from_the_dashboards_data_leaves_out_what_a_probe_shared_too():
    """``e`` on a job without a record: the dashboard's ~1 s points and its events."""
    from bsmon.probes.record.conversions import point_of
    from bsmon.tui.export import summary_from_snapshot
    from bsmon.tui.session import ConnState, Snapshot

    items = beside_a_probe()
    points = tuple(point_of(item) for item in items if isinstance(item, Span))
    events = tuple(item for item in items if isinstance(item, Event))
    snap = Snapshot(ConnState.LIVE, "", "demo", session(), points=points, events=events)
    sizes = {b.batch_size: b for b in summary_from_snapshot(snap).batch_sizes}
    assert sizes[128].left_out_steps == 570
    assert sizes[128].samples_per_s == pytest.approx(7300, rel=0.03)


def test_a_loss_that_diverged_after_a_change_is_a_warning_and_a_recommendation(tmp_path):
    message = "loss rose 0.31 → 2.3, well above its level before the change after batch 64 → 1"
    event = Event(
        t=START + 3,
        step=30,
        kind="loss_diverged",
        level="warning",
        message=f"{message} at step 20: the change is the likely cause",
        data={"change_step": 20, "old": 64, "new": 1},
    )
    items = [header_for(session(), 64, START), timed_span(0, 10, samples=64), event]
    summary = write_record(tmp_path / "r.jsonl", items)
    assert any(w.kind == "loss_diverged" and message in w.message for w in summary.warnings)
    (note,) = [r for r in summary.recommendations if r.kind == "loss_diverged_after_batch_change"]
    assert message in note.message and "restore a checkpoint" in note.message
    assert (note.step, note.t_s) == (30, 3.0)  # when, as its warning says
    markdown = (tmp_path / "summary.md").read_text()
    assert "n/a in" not in markdown
    assert markdown.count("(step 30, 3.0 s in)") == 2  # the warning and the recommendation


def test_a_divergence_that_recovered_is_one_note_with_its_time_and_no_checkpoint_advice(tmp_path):
    rose = "loss rose 0.74 → 1.3, well above its level before the change after batch 128 → 262"
    recovered = "loss recovered to 0.85 at step 9,050 (it rose after batch 128 → 262 at step 8,968)"
    change = {"change_step": 8968, "old": 128, "new": 262}
    items = [
        header_for(session(), 128, START),
        timed_span(0, 10, samples=128),
        Event(
            t=START + 3,
            step=9000,
            kind="loss_diverged",
            level="warning",
            message=f"{rose} at step 8,968: the change is the likely cause",
            data={**change, "before": 0.74, "after": 1.3},
        ),
        Event(
            t=START + 5,
            step=9050,
            kind="loss_recovered",
            message=recovered,
            data={**change, "step": 9050, "after": 0.85},
        ),
    ]
    summary = write_record(tmp_path / "r.jsonl", items)
    assert not [w for w in summary.warnings if w.kind == "loss_diverged"]
    (note,) = [w for w in summary.warnings if w.kind == "loss_recovered"]
    assert (note.message, note.step, note.t_s) == (recovered, 9050, 5.0)
    assert not [r for r in summary.recommendations if "diverged" in r.kind]
    markdown = (tmp_path / "summary.md").read_text()
    assert "restore a checkpoint" not in markdown and "n/a in" not in markdown
    assert markdown.count(f"{recovered} (step 9,050, 5.0 s in)") == 1


def changes_through_the_watch(losses_after: list[float]):
    """The demo's run (newcomer review 2, finding 3): the loss down from 2.3 to 0.74 at batch
    128, batch 262 from step 8,968, then ``losses_after``, one per 10-step window, through the
    agent's batch watch. Returns the watch and the events it said."""
    from bsmon.probes.batch.watch import ChangeWatch
    from bsmon.probes.wire.protocol import BatchChange, Metrics

    rng = random.Random(3)
    now = {"step": 0}
    watch = ChangeWatch(128, lambda: now["step"])

    def window(step: int, size: int, loss: float) -> list[Event]:
        now["step"] = step
        return watch.observe(
            Metrics(
                t=START + step / 100, step=step, batch_size=size, step_time_s=0.1,
                samples_per_s=size * 10.0, b_simple=None, steps_in_window=10,
                scalars={"loss": loss},
            )
        )  # fmt: skip

    before = [2.3, 1.5, 1.0] + [0.74 + rng.gauss(0, 0.01) for _ in range(20)]
    for k, loss in enumerate(before):
        window(8968 - 10 * (len(before) - 1 - k), 128, loss)
    watch.add_change(
        BatchChange(step=8968, t=START, old=128, new=262, reason="probe", source="monitor")
    )
    events = [e for k, loss in enumerate(losses_after) for e in window(8978 + 10 * k, 262, loss)]
    return watch, events


@pytest.mark.parametrize("recovers", [True, False])
def test_the_batch_watchs_events_make_the_summary_say_a_recovery_once_or_advise_a_checkpoint(
    tmp_path, recovers
):
    """The loss rose after batch 128 → 262 and came back within ~90 steps at the same size (the
    summary reads the record's events, as a replay does): no stale alarm; one that stays up
    keeps the warning and the advice."""
    rise = [1.3, 1.36, 1.25, 1.17]
    back = [0.9, 0.86, 0.83, 0.69, 0.7, 0.69] if recovers else [1.3] * 6
    start = time.time()
    watch, events = changes_through_the_watch(rise + back)
    said = [e for e in events if e.kind.startswith("loss")]
    assert [e.kind for e in said] == ["loss_diverged"] + ["loss_recovered"] * recovers
    assert watch.latest.loss == ("recovered" if recovers else "diverged")
    assert watch.trained_well == 128  # a size whose loss rose is not one that trained well
    if recovers:
        data = said[1].data
        assert data == {"change_step": 8968, "old": 128, "new": 262, "step": 9028, "after": 0.9}
        assert said[1].message == (
            "loss recovered to 0.9 at step 9,028 (it rose after batch 128 → 262 at step 8,968)"
        )
    items = [header_for(session(start=start), 128, start), *events]
    summary = write_record(tmp_path / "r.jsonl", items)
    kinds = [w.kind for w in summary.warnings if w.kind.startswith("loss")]
    advice = [r for r in summary.recommendations if r.kind == "loss_diverged_after_batch_change"]
    markdown = (tmp_path / "summary.md").read_text()
    if recovers:
        assert (kinds, advice) == (["loss_recovered"], [])
        assert "restore a checkpoint" not in markdown
        assert markdown.count("loss recovered to 0.9 at step 9,028") == 1
    else:
        assert (kinds, len(advice)) == (["loss_diverged"], 1)
        assert "restore a checkpoint" in markdown
    assert "n/a in" not in markdown


def test_a_note_whose_time_is_not_known_gives_its_step_alone():
    from bsmon.probes.summary.markdown import _notes
    from bsmon.probes.summary.schema import Note

    text = _notes("Warnings", [Note("k", "said", step=8984)], "none")
    assert text.endswith("- said (step 8,984)\n") and "n/a" not in text


def test_spikes_in_a_short_run_name_the_slowest_step_not_a_share_of_steps():
    """'1% of steps' of a 24-step run would name less than one step."""
    from types import SimpleNamespace

    from bsmon.probes.summary.recommend import _spikes
    from bsmon.probes.summary.schema import StepTime

    def said(**times) -> str:
        notes = []
        _spikes(SimpleNamespace(step_time_s=StepTime(p50=0.01, **times)), notes)
        (note,) = notes
        return note.message

    short = said(timed_steps=24, p99=0.09, max=0.1)
    assert short.startswith("the slowest of the 24 timed steps took 10.0× the median step time")
    assert said(timed_steps=2400, p99=0.09, max=0.5).startswith("1% of steps took over 9.0×")


def test_the_autopilots_decisions_and_final_claim_are_summarized(tmp_path):
    synthetic = two_phase()
    decision = {"step": 1000, "t": START + 50, "old": 32, "new": 64, "kind": "grow"}
    decision |= {"b_simple": 240.0, "b_simple_low": 200.0, "b_simple_high": 290.0}
    decision |= {"half_batch": 30.0, "target": 77, "predicted_gain": 1.18}
    synthetic.events += [
        Event(t=START + 1, step=10, kind="autopilot_state", message="autopilot on at batch 32"),
        Event(
            t=START + 50,
            step=1000,
            kind="autopilot",
            message="autopilot: batch 32 → 64 at step 1,000 (...)",
            data={"decision": decision, "claimed_gain": 1.0},
        ),
        Event(
            t=START + 74,
            step=1500,
            kind="autopilot_state",
            message="autopilot at the end: batch 32 → 64 in 1 decision; 1.31× claimed ...",
            data={"end": True, "claimed_gain": 1.31, "start_size": 32},
        ),
    ]
    summary = summarize_record(synthetic.write(tmp_path / "r.jsonl"))
    autopilot = summary.autopilot
    assert autopilot is not None and autopilot.claimed_gain == 1.31 and autopilot.start_size == 32
    assert [d["new"] for d in autopilot.decisions] == [64]
    assert [n.step for n in autopilot.said] == [10, 1500]
    export_record(tmp_path / "r.jsonl", tmp_path / "out")
    markdown = (tmp_path / "out" / "summary.md").read_text()
    section = markdown[markdown.index("## Autopilot") :]
    assert "**1.31×** the progress per second of a fixed batch of 32" in section
    assert "| 1,000 | 32 → 64 | grow | 240 | [200, 290] | 30 | 77 | 1.18× |" in section
    assert summarize_record(two_phase().write(tmp_path / "plain.jsonl")).autopilot is None


FIRST_STEP_NOTE = "Step 1 is n/a: a job that makes its batches itself"


def test_a_hand_cut_jobs_uncounted_first_step_is_explained_under_the_history(tmp_path):
    """A job with no DataLoader (nanoGPT's get_batch) is counted from its second step: its
    record opens with a span of step 1 alone, untimed and with no size (as nanoGPT's under
    ``bsmon run`` did). The history keeps that row and says why it is n/a; a job whose first
    step has a size gets no such line."""
    rng = random.Random(3)
    first = Span(t0=START, t1=START + 0.3, step=1, steps=1, timed_s=0.0)
    later = [msgspec.structs.replace(s, step=s.step + 1) for s in noisy_spans(rng, 12, 190.0, 5, 0)]
    summary = write_record(
        tmp_path / "r.jsonl", [header_for(session(), None, START), first, *later]
    )
    history = [(s.batch_size, s.from_step, s.to_step) for s in summary.batch_size_history]
    assert history == [(None, 1, 1), (12, 2, 51)]
    markdown = (tmp_path / "summary.md").read_text()
    in_order = markdown[markdown.index("In order:") : markdown.index("What each size reached")]
    assert "| n/a | 1–1 |" in in_order and FIRST_STEP_NOTE in in_order

    write_record(tmp_path / "counted.jsonl", [header_for(session(), 12, START), *later])
    assert FIRST_STEP_NOTE not in (tmp_path / "summary.md").read_text()


def test_summary_charts_label_their_axes_with_round_ticks():
    from bsmon.probes.summary.text_charts import chart

    points = [(119 + 100 * i, 8000 + 737.3 * math.sin(i / 5)) for i in range(137)]
    text = chart(points, "samples/s by step", "step")
    axis = text.splitlines()[-2].split()  # the line of x labels, above "step"
    assert axis == ["2.5k", "5k", "7.5k", "10k", "12.5k"]
    y_labels = [line.split("┤")[0].strip() for line in text.splitlines() if "┤" in line]
    assert len(y_labels) >= 2 and all(label.endswith("k") for label in y_labels)
    assert all(float(label[:-1]) * 1000 % 250 == 0 for label in y_labels), y_labels


def test_a_size_that_varies_is_one_stretch_with_its_range_apart_from_unknown_steps(tmp_path):
    first = timed_span(0, 1, samples=None)
    varying = [
        msgspec.structs.replace(
            timed_span(k, 5, samples=12),
            step=1 + 5 * k,
            samples=60 * k,
            batch_size=None,
            batch_range=r,
        )
        for k, r in ((1, [10, 40]), (2, [5, 27]))
    ]
    summary = write_record(
        tmp_path / "r.jsonl",
        [
            header_for(session(), None, START),
            first,
            *varying,
            End(t=START + 3, reason="closed", step=11, samples=120),
        ],
    )
    history = summary.batch_size_history
    assert [(s.batch_size, s.varies) for s in history] == [
        (None, None),
        (None, "varies 5–40 per step"),
    ]
    assert history[1].steps == 10 and history[1].samples_per_s == 120  # 12 per 0.1 s step
    assert sorted((b.steps, b.varies or "") for b in summary.batch_sizes) == [
        (1, ""),
        (10, "varies 5–40 per step"),
    ]
    md = (tmp_path / "summary.md").read_text()
    assert "| varies 5–40 per step | 2–11 |" in md


@pytest.mark.parametrize("batch", [10, 24, 25, 26, 50, 100, 101, 400])
def test_the_noise_panel_and_the_summary_say_one_verdict(summary, batch):
    """The Noise panel's "raise B / B too big" and the summary's advice come from one rule
    (wire.describe.noise_verdict): the thresholds were written twice and one copy changed
    alone (issue 41)."""
    from bsmon.probes.summary import recommend
    from bsmon.tui.widgets.noise import meaning

    b_simple = 50.0
    ended = msgspec.structs.replace(
        summary,
        b_simple=msgspec.structs.replace(summary.b_simple, end=b_simple),
        batch_size_history=[
            msgspec.structs.replace(summary.batch_size_history[-1], batch_size=batch)
        ],
    )
    kinds = {n.kind for n in recommend.recommendations(ended)}
    (panel,) = meaning(batch, b_simple, compact=True)
    said = panel.text.rsplit(" · ", 1)[1]
    expected = {"raise B": "batch_below_noise_scale", "B too big": "batch_above_noise_scale"}
    assert said == ("raise B" if batch < 25 else "B too big" if batch > 100 else "balanced")
    assert kinds & set(expected.values()) == ({expected[said]} if said in expected else set())


def advice_event(step: int, advice: Advice, final: bool = False) -> Event:
    data: dict = {"advice": msgspec.to_builtins(advice)}
    if final:
        data["final"] = True
    lead = "final word" if final else "advice"
    return Event(
        t=START + step / 10,
        step=step,
        kind="advice",
        message=describe_advice(advice, lead),
        data=data,
    )


def test_the_final_word_is_the_advisors_last_answer_and_how_it_got_there(tmp_path):
    """One answer (issue 41): the summary's final word is the advice as the job ended, with
    its reasons, confidence and what would change it, and the answers it gave on the way."""
    wait = Advice(
        64, 64, "wait", reasons=["waiting for B_simple to resolve"], headline="stay at 64"
    )
    stay = Advice(
        64,
        64,
        "stay",
        rule="threshold",
        reasons=["holding at 64: 128 predicted 0.98× the progress per second", "memory: up to 900"],
        confidence="medium",
        would_change="B_simple above ≈ 310 would make 128 pay (B_simple ≈ 213 now)",
        headline="stay at 64",
        why="0.98× < 1.05×",
    )
    items = [
        header_for(session(), 64, START),
        timed_span(0, 10, samples=64),
        advice_event(10, wait),
        advice_event(40, stay),
        advice_event(90, stay, final=True),
    ]
    summary = write_record(tmp_path / "r.jsonl", items)
    word = summary.final_word
    assert word is not None and not word.ended_without
    assert word.advice["action"] == "stay" and word.advice["confidence"] == "medium"
    assert [(n.step, n.message) for n in word.said] == [
        (10, "stay at 64"),
        (40, "stay at 64 (0.98× < 1.05×)"),
    ]
    markdown = (tmp_path / "summary.md").read_text()
    assert (
        "## Final word on the batch size\n\n**stay at 64**, confidence medium: holding at 64"
        in (markdown)
    )
    assert "- what would change it: B_simple above ≈ 310 would make 128 pay" in markdown
    assert markdown.index("## Final word") < markdown.index("## Run")  # under the story
    killed = write_record(tmp_path / "k.jsonl", items[:-1])  # no final word: the last answer
    assert killed.final_word.ended_without and killed.final_word.advice["rule"] == "threshold"
    assert "(its last answer: the job ended without a final word)" in (
        (tmp_path / "summary.md").read_text()
    )


def test_an_estimate_that_stopped_for_good_keeps_its_reason(tmp_path):
    """layerwise.py under bsmon run (r16, a busy machine): the noise scale measured the first
    optimizer's parameters, resolved 18.2 within its first 200 steps, then stopped when that
    optimizer stopped stepping. The summary kept the estimate and lost why it ended."""
    why = "it measured the gradients of the parameters SGD trains, and SGD stopped stepping at 200"
    spans = [
        make_span(START + k, START + k + 1, 1 + 10 * k, [0.01] * 10, 8, 80 * k, b_simple=18.2)
        for k in range(3)
    ]
    off = Event(
        t=START + 3,
        step=30,
        kind="noise_scale",
        message=f"noise scale: off — {why}",
        level="warning",
    )
    summary = write_record(tmp_path / "r.jsonl", [header_for(session(), 8, START), *spans, off])
    assert summary.b_simple.end == pytest.approx(18.2) and summary.b_simple.note == why


def test_peak_reserved_share_and_the_allocators_retries_and_ooms_per_gpu(tmp_path):
    """The allocator's own peak (it sees between samples) over the sampled reserved bytes;
    the retries and OOMs as counted by the run's end (the spans merged: the most)."""
    from bsmon.probes.record.format import DeviceSpan

    def span(k: int, retries: int, ooms: int, peak: int) -> Span:
        device = DeviceSpan(
            index=0,
            mem_total=80 * GIB,
            torch_reserved=60 * GIB,
            torch_reserved_peak=peak,
            alloc_retries=retries,
            ooms=ooms,
        )
        return msgspec.structs.replace(timed_span(k, 5, samples=8), devices=[device])

    summary = write_record(
        tmp_path / "r.jsonl",
        [
            header_for(session(), None, START),
            span(0, 0, 0, 70 * GIB),
            span(1, 12, 1, 78 * GIB),
            span(2, 12, 1, 72 * GIB),
            End(t=START + 3, reason="closed", step=15, samples=120),
        ],
    )
    (gpu,) = summary.devices
    assert gpu.torch_reserved_peak_bytes == 78 * GIB
    assert gpu.torch_reserved_peak_fraction == pytest.approx(78 / 80)
    assert (gpu.alloc_retries, gpu.ooms) == (12, 1)
    md = (tmp_path / "summary.md").read_text()
    assert "| 78.0 GiB (98%) | 12 · 1 |" in md


def test_on_several_ranks_the_panel_and_the_summary_weigh_the_whole_steps_batch(summary):
    """B_simple counts a step's examples over every rank: 20 on each of 2 ranks is a step of
    40 against B_simple 50 (balanced); read as 20 alone it was "raise B"."""
    from bsmon.probes.summary import recommend
    from bsmon.tui.widgets.noise import meaning

    ended = msgspec.structs.replace(
        summary,
        run=msgspec.structs.replace(summary.run, world_size=2),
        b_simple=msgspec.structs.replace(summary.b_simple, end=50.0),
        batch_size_history=[msgspec.structs.replace(summary.batch_size_history[-1], batch_size=20)],
    )
    kinds = {n.kind for n in recommend.recommendations(ended)}
    assert not kinds & {"batch_below_noise_scale", "batch_above_noise_scale"}
    (compact,) = meaning(20, 50.0, compact=True, ranks=2)
    assert compact.text.endswith(" · balanced") and compact.text.startswith("B=40 ")
    first = meaning(20, 50.0, ranks=2)[0].text
    assert first.startswith("at batch 40 (20 on each of 2 ranks) a step is worth ≈44%")
    (alone,) = meaning(20, 50.0, compact=True)
    assert alone.text.endswith(" · raise B")
