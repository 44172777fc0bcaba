"""The agent's session record: where it goes, what it holds, compaction, and failing disks."""

from __future__ import annotations

import json
import math
import stat
import subprocess
import sys

import msgspec
import pytest

from bsmon.probes import attach
from bsmon.probes.anatomy.seconds import Phases
from bsmon.probes.record.format import End, ProbeLine, Span
from bsmon.probes.record.reader import open_record
from bsmon.probes.record.recorder import Recorder
from bsmon.probes.runtime.devices import DeviceSample
from bsmon.probes.runtime.steps import StepDone, StepRun
from bsmon.probes.runtime.telemetry import Telemetry
from bsmon.probes.summary.build import paths_beside, summarize_record
from bsmon.probes.summary.schema import Summary
from bsmon.probes.wire.client import JobConnection
from bsmon.probes.wire.protocol import Capability, DeviceReading, Event, HostReading

from ..helpers import wait_until
from ..jobs import TinyJob
from ..records import START, session


def the_record_error(mon) -> Event:
    """The one record_error event the monitor reports (waits for it)."""

    def found():
        mon.flush()
        return [e for e in mon.job.telemetry.events if e.kind == "record_error"]

    (event,) = wait_until(found, message="a record_error event")
    return event


def record_items(path):
    with open_record(path) as reader:
        return reader, list(reader.lines())


def test_every_session_is_recorded_in_bsmon_dir_with_a_summary_beside_it(bsmon_dir):
    job = TinyJob()
    with attach(job.model, job.optimizer, batch_size=8, name="rec") as mon:
        path = mon.job.recorder.path
        assert mon.stats()["record"] == str(path) == mon.session.record
        conn = JobConnection(mon.socket_path)
        with conn:
            assert conn.hello().session.record == str(path)  # the dashboard learns it from hello
        for _ in range(30):
            job.step(mon)
        mon.log(grad_norm=float("inf"))
        assert mon.flush()
    assert path.parent == bsmon_dir / "records"
    assert path.name.endswith(f"-rec-{mon.session.pid}.jsonl")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    reader, items = record_items(path)
    assert reader.header.session.name == "rec" and reader.header.batch_size == 8
    assert reader.end is not None and reader.end.reason == "closed" and reader.end.step == 30
    kinds = [i.kind for i in items if isinstance(i, Event)]
    assert kinds[:1] == ["attached"] and "nonfinite_scalar" in kinds
    spans = [i for i in items if isinstance(i, Span)]
    assert sum(s.steps for s in spans) == 30 and spans[-1].samples == 240
    assert all(s.t1 - s.t0 <= 1.0 for s in spans)  # at most a second each
    json_path, md_path = paths_beside(path)
    assert stat.S_IMODE(json_path.stat().st_mode) == stat.S_IMODE(md_path.stat().st_mode) == 0o600
    summary = msgspec.json.decode(json_path.read_bytes(), type=Summary)
    assert summary.steps == 30 and summary.samples == 240 and summary.run.end_reason == "closed"
    assert md_path.read_text().startswith("# bsmon summary: rec")


def test_record_false_writes_nothing(bsmon_dir):
    job = TinyJob()
    with attach(job.model, job.optimizer, batch_size=8, record=False) as mon:
        job.step(mon)
        assert mon.job.recorder is None and mon.session.record is None
    assert not (bsmon_dir / "records").exists()


def test_record_path_puts_it_there(bsmon_dir, tmp_path):
    job = TinyJob()
    target = tmp_path / "runs" / "exp1.jsonl"
    with attach(job.model, job.optimizer, batch_size=8, record=target) as mon:
        for _ in range(5):
            job.step(mon)
        mon.record_probe_result({"max_batch_size": 256, "fits": [8, 16, 256]})
    assert summarize_record(target).steps == 5
    assert sorted(p.name for p in target.parent.iterdir()) == [
        "exp1.jsonl",
        "exp1.summary.json",
        "exp1.summary.md",
    ]
    summary = json.loads((target.parent / "exp1.summary.json").read_text())
    assert summary["probes"][0]["max_batch_size"] == 256
    assert "max_batch_size=256" in (target.parent / "exp1.summary.md").read_text()


def test_a_bad_record_option_is_a_clear_error(bsmon_dir):
    job = TinyJob()
    with pytest.raises(TypeError, match="record must be True, False or a path"):
        attach(job.model, job.optimizer, record=3)


def test_an_unwritable_record_location_is_an_event_and_the_job_goes_on(bsmon_dir, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where a directory should be")
    job = TinyJob()
    with attach(job.model, job.optimizer, batch_size=8, record=blocker / "r.jsonl") as mon:
        for _ in range(10):
            job.step(mon)

        event = the_record_error(mon)
        assert event.level == "warning"
        assert "recording stopped: cannot write" in event.message
        assert "the job goes on unrecorded" in event.message
        for _ in range(10):
            job.step(mon)
        assert mon.step == 20 and mon.stats()["errors"] == 0


FULL_DISK_JOB = """
import resource, signal, sys, torch
from bsmon.probes import attach
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # writes past the limit fail with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (1500, 1500))   # a disk that fills after 1.5 kB
m = torch.nn.Linear(4, 1)
o = torch.optim.SGD(m.parameters(), lr=0.01)
mon = attach(m, o, batch_size=8, name="full", record=sys.argv[1])
errors = []
while not errors and mon.step < 20_000:   # about a second of spans fills the 1.5 kB
    m(torch.randn(8, 4)).pow(2).mean().backward(); o.step(); o.zero_grad()
    mon.log(loss=1.0)
    if mon.step % 50 == 0:
        mon.flush()
        errors = [e.message for e in mon.job.telemetry.events if e.kind == "record_error"]
for _ in range(100):   # and the job goes on
    m(torch.randn(8, 4)).pow(2).mean().backward(); o.step(); o.zero_grad()
mon.close()
print("errors", errors)
print("steps after the error", mon.step - 100 >= 50)
"""


def test_a_full_disk_stops_recording_with_an_event_and_the_job_finishes(tmp_path, bsmon_dir):
    record = tmp_path / "full.jsonl"
    result = subprocess.run(
        [sys.executable, "-c", FULL_DISK_JOB, str(record)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "recording stopped: cannot write" in result.stdout, result.stdout
    assert "File too large" in result.stdout and "the job goes on unrecorded" in result.stdout
    assert "steps after the error True" in result.stdout
    assert "Traceback" not in result.stderr
    assert record.stat().st_size <= 1500
    summary = summarize_record(record)  # what made it to disk still reads (torn tail or not)
    # an end fits only where cutting the torn tail made room for it, and then it says why
    assert not summary.run.complete or "File too large" in summary.run.recording_stopped


def sample(util: float) -> DeviceSample:
    return DeviceSample(
        devices=[
            DeviceReading(
                index=0,
                name="Fake",
                util_percent=util,
                memory_used_bytes=int(util) << 20,
                memory_total_bytes=100 << 20,
            )
        ],
        gpu=Capability(True),
        host=HostReading(cpu_percent=50.0, rss_bytes=1 << 30),
    )


def test_the_writer_compacts_a_long_record_and_keeps_it_exact(tmp_path):
    """An hour of half-second spans with a small per-level budget, driven by a fake clock."""
    path = tmp_path / "long.jsonl"
    events: list[Event] = []
    telemetry = Telemetry()
    telemetry.batch_size = 16
    recorder = Recorder(
        path,
        session(start=START),
        telemetry,
        events.append,
        per_level=16,
        clock=lambda: START,
    )
    recorder.start()
    buckets, per_bucket = 3600 * 2, 4
    durations = []
    step = 0
    noise = Capability(False, "off")
    for k in range(buckets):
        for i in range(per_bucket):
            step += 1
            duration = 0.1 + 0.001 * ((k + i) % 17)
            durations.append(duration)
            recorder.on_step(StepDone(step, duration, 16, 16))
        new_events = (
            [Event(t=START + k * 0.5, step=step, kind="tick", message=str(k))]
            if (k % 1000 == 0)
            else []
        )
        recorder.tick(START + (k + 1) * 0.5 + 0.01, new_events, sample(float(k % 101)), noise)
        if k % 500 == 0:  # a real job makes two spans a second; do not outrun the writer
            wait_until(lambda: recorder.writer._queue.qsize() < 100, message="the writer")
    assert recorder.close("closed", step, timeout=60)
    assert not events, events  # no failure reported
    assert recorder.writer.compactions >= buckets // 16 - 1
    reader, items = record_items(path)
    spans = [i for i in items if isinstance(i, Span)]
    levels = math.log2(buckets / 16 + 1) + 1
    assert len(spans) <= 16 * (levels + 2), len(spans)
    assert len(spans) < buckets / 50
    assert [i.message for i in items if isinstance(i, Event)] == [
        str(k) for k in range(0, buckets, 1000)
    ]
    assert sum(s.steps for s in spans) == step == reader.end.step
    summary = summarize_record(path)
    assert summary.steps == step and summary.samples == 16 * step
    assert summary.step_time_s.min == pytest.approx(min(durations))
    assert summary.step_time_s.max == pytest.approx(max(durations))
    assert summary.step_time_s.mean == pytest.approx(sum(durations) / len(durations), rel=1e-5)
    assert summary.devices[0].util_max_percent == 100.0
    assert summary.devices[0].memory_peak_bytes == 100 << 20
    assert not path.with_name(path.name + ".tmp").exists()


def test_a_polls_columns_are_recorded_as_the_same_steps_one_by_one(tmp_path):
    """The telemetry hands the recorder a poll's steps as columns; batch-size changes inside
    a poll, steps not timed, samples not counted, evaluation time and sampled phases come
    out in the same spans as when each step is handed over alone."""
    sizes = [4] * 5 + [8] * 4 + [4] * 3
    durations = [0.1, 0.2, None, 0.15, 0.1, math.inf, 0.3, 0.25, 0.2, 0.1, 0.0, 0.12]
    samples = [4, 4, 4, None, 4, 8, 8, 8, None, 4, 4, 4]
    eval_s = [0.0, 0.0, 0.0, 0.0, 0.05, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.02]
    phases = [None] * 12
    phases[3] = Phases(0.01, 0.05, 0.07, 0.01, 0.01)
    phases[7] = Phases(None, 0.1, 0.1, 0.03, 0.02)
    run = StepRun(range(1, 13), durations, samples, sizes, eval_s, phases)
    records = []
    for name, feed in (
        ("columns", lambda recorder: recorder.on_steps(run)),
        (
            "one by one",
            lambda recorder: [recorder.on_step(StepDone(*row)) for row in zip(*run, strict=True)],
        ),
    ):
        path = tmp_path / f"{name}.jsonl"
        events: list[Event] = []
        recorder = Recorder(
            path, session(start=START), Telemetry(), events.append, clock=lambda: START
        )
        recorder.start()
        feed(recorder)
        recorder.tick(START + 1.0, [], sample(50.0), Capability(False, "off"))  # the last span
        assert recorder.close("closed", 12, timeout=30) and not events
        records.append([i for i in record_items(path)[1] if isinstance(i, (Span, End))])
    columns, one_by_one = records
    assert [(s.batch_size, s.steps) for s in columns[:-1]] == [(4, 5), (8, 4), (4, 3)]
    assert [s.timed_steps for s in columns[:-1]] == [4, 3, 2]  # None, inf and 0.0 not timed
    assert columns[-1].samples == 52  # the samples not counted count 0
    assert columns == one_by_one


def test_two_monitors_of_one_name_in_one_process_get_two_records(bsmon_dir):
    jobs = [TinyJob(seed=i) for i in range(2)]
    mons = [attach(j.model, j.optimizer, batch_size=8, name="twin") for j in jobs]
    for mon in mons:
        mon.close()
    first, second = (mon.job.recorder.path for mon in mons)
    assert first != second and first.exists() and second.exists()
    assert summarize_record(first).run.name == summarize_record(second).run.name == "twin"


def test_a_rerun_with_the_same_record_path_does_not_overwrite_the_first(bsmon_dir, tmp_path):
    target = tmp_path / "exp.jsonl"
    paths = []
    for _ in range(2):
        job = TinyJob()
        with attach(job.model, job.optimizer, batch_size=8, record=target) as mon:
            job.step(mon)
        paths.append(mon.job.recorder.path)
    assert paths == [target, tmp_path / "exp-2.jsonl"]
    assert all(summarize_record(p).steps == 1 for p in paths)
    assert (tmp_path / "exp-2.summary.md").exists()


def test_after_a_failure_the_recorder_stops_listening(bsmon_dir, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    job = TinyJob()
    with attach(job.model, job.optimizer, batch_size=8, record=blocker / "r.jsonl") as mon:
        wait_until(lambda: mon.job.recorder.failed, message="the recorder to fail")
        job.step(mon)
        wait_until(lambda: mon.flush() and mon.job.telemetry.tap is None, message="the tap removed")
        assert mon.step == 1


def test_a_bug_in_the_recorder_ends_only_the_recording(bsmon_dir, monkeypatch):
    import bsmon.probes.record.recorder as record_module

    def broken(_durations, _into):
        raise ZeroDivisionError("injected")

    monkeypatch.setattr(record_module, "count_step_bins", broken)
    job = TinyJob()
    with attach(job.model, job.optimizer, batch_size=8, name="buggy") as mon:
        for _ in range(10):
            job.step(mon)

        event = the_record_error(mon)
        assert "internal error in the recorder (ZeroDivisionError: injected)" in event.message
        for _ in range(10):
            job.step(mon)
        assert mon.flush() and mon.stats()["step"] == 20  # the agent thread goes on
        assert mon.stats()["step_time_s"] is not None and mon.stats()["errors"] == 0


def test_a_probe_result_goes_into_the_record_and_the_summary(bsmon_dir):
    from .test_probe import crash, train_a_little

    _, _, mon = train_a_little(probe_step=crash)  # a sidecar that dies at once: a quick result
    with mon:
        result = mon.probe(memory_budget=2000 << 20, timeout=120)
        assert result.status == "crashed"
    _, items = record_items(mon.job.recorder.path)
    (probe,) = [i for i in items if isinstance(i, ProbeLine)]
    assert probe.step == 5 and probe.result["status"] == "crashed"
    assert "the sidecar crashed" in probe.result["error"]
    json_path, md_path = paths_beside(mon.job.recorder.path)
    summary = msgspec.json.decode(json_path.read_bytes(), type=Summary)
    assert summary.probes[0]["status"] == "crashed" and summary.probes[0]["step"] == 5
    assert "crashed · error: the sidecar crashed" in md_path.read_text()


def test_a_scalars_first_and_last_are_the_values_logged_not_a_spans_mean(bsmon_dir):
    """A loss that falls fast in the first half-second: the summary's first is the first
    value logged (the first step's), its last the last one, not their spans' means."""
    job = TinyJob()
    with attach(job.model, job.optimizer, batch_size=8, name="first") as mon:
        path = mon.job.recorder.path
        for i in range(40):
            job.step(mon)
            mon.log(score=10.0 - 0.25 * i)
        assert mon.flush()
    reader, items = record_items(path)
    spans = [i for i in items if isinstance(i, Span)]
    assert spans[0].scalars["score"].mean < 10.0  # the first span holds several values
    assert reader.end.last["score"] == 0.25
    json_path, _ = paths_beside(path)
    score = msgspec.json.decode(json_path.read_bytes(), type=Summary).scalars["score"]
    assert (score.first, score.last, score.n) == (10.0, 0.25, 40)
