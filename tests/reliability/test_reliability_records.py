"""Truncated and corrupt records fed to export and replay: a summary, or one RecordError.

A record is cut at a generated offset, has bytes overwritten, or has a line of garbage put in;
``summarize_record`` (what ``bsmon export`` runs) and ``load_replay`` (what ``bsmon replay``
runs) either read it or raise ``RecordError`` — never another exception.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bsmon.probes.record.reader import RecordError
from bsmon.probes.summary.build import paths_beside, summarize_record
from bsmon.probes.summary.markdown import render_markdown
from bsmon.tui.replay import load_replay

from ..records import two_phase
from ..watch import kill_run_processes

RECORD = b"".join(two_phase().lines())
SMALL = b"".join(two_phase().lines()[:40])  # no end line: an incomplete run


def readers_agree_or_refuse(data: bytes) -> str:
    """'read' or 'refused'; anything other than RecordError fails the test."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.jsonl"
        path.write_bytes(data)
        try:
            summarize_record(path)
            load_replay(path)
        except RecordError as exc:
            assert "\n" not in str(exc) and str(exc)
            return "refused"
    return "read"


@st.composite
def corrupted(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from([RECORD, SMALL])))
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(data) - 1))
        data[at : at + 1] = draw(st.binary(min_size=1, max_size=3))
    if draw(st.booleans()):
        lines = bytes(data).split(b"\n")
        at = draw(st.integers(0, len(lines)))
        junk = draw(st.binary(max_size=40) | st.sampled_from([b"[" * 50_000, b'{"type":"\xff"}']))
        lines.insert(at, junk.replace(b"\n", b" "))
        data = bytearray(b"\n".join(lines))
    return bytes(data[: draw(st.integers(0, len(data)))])


@settings(
    max_examples=1000,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(corrupted())
def test_a_corrupt_or_truncated_record_is_read_or_refused_in_one_line(data):
    readers_agree_or_refuse(data)


def test_a_record_cut_anywhere_inside_its_body_still_reads():
    header_end = RECORD.index(b"\n") + 1
    for cut in range(header_end, len(RECORD), len(RECORD) // 97):
        assert readers_agree_or_refuse(RECORD[:cut]) == "read", cut


def test_bytes_that_are_not_utf8_or_nest_too_deep_are_refused_not_raised():
    header_end = RECORD.index(b"\n") + 1
    for bad in (b'{"type":"span","x":"\xff"}', b"[" * 100_000):
        assert readers_agree_or_refuse(RECORD[:header_end] + bad + b"\n" + RECORD) == "read"
        assert readers_agree_or_refuse(bad + b"\n" + RECORD) == "refused"


def test_spans_with_timed_steps_but_no_time_still_read():
    assert (
        readers_agree_or_refuse(re.sub(rb'"timed_s":[0-9.e-]+', b'"timed_s":0.0', RECORD)) == "read"
    )


# A job whose records disk fills after 6 kB (RLIMIT_FSIZE: a full disk that works as root),
# then, with "room", has room again before it ends, else none at all. It prints one line.
FULL_DISK_JOB = """
import resource, signal, sys, torch
from bsmon.probes import attach
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # writes past the limit fail with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (6000, resource.RLIM_INFINITY))
m = torch.nn.Linear(4, 1)
o = torch.optim.SGD(m.parameters(), lr=0.01)
mon = attach(m, o, batch_size=8, name="full", record=sys.argv[1])
while mon.job.recorder.failed is None and mon.step < 50_000:
    m(torch.randn(8, 4)).pow(2).mean().backward(); o.step(); o.zero_grad()
    mon.log(loss=1.0)
    if mon.step % 50 == 0:
        mon.flush()
stopped_at = mon.step
for _ in range(100):   # the job goes on
    m(torch.randn(8, 4)).pow(2).mean().backward(); o.step(); o.zero_grad()
room = resource.RLIM_INFINITY if sys.argv[2] == "room" else 1   # or not even for an end line
resource.setrlimit(resource.RLIMIT_FSIZE, (room, resource.RLIM_INFINITY))
mon.close()
print("job: stopped at", stopped_at, "ended at", mon.step)
"""


def run_full_disk_job(tmp_path: Path, room: str) -> tuple[subprocess.CompletedProcess, Path]:
    record = tmp_path / "full.jsonl"
    result = subprocess.run(
        [sys.executable, "-c", FULL_DISK_JOB, str(record), room],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return result, record


def test_a_recording_stopped_by_a_full_disk_says_so_in_one_line_and_is_not_called_killed(
    bsmon_dir, tmp_path
):
    """It said so only on the socket, and the summary called the job's clean exit 'no clean
    end (killed?)'. Now one RuntimeWarning line on stderr (nothing else bsmon's), and the
    summary of a record that could not say why names every possibility, not a kill."""
    result, record = run_full_disk_job(tmp_path, "full")
    assert result.stdout.startswith("job: stopped at ") and result.stdout.count("\n") == 1
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"bsmon:0: RuntimeWarning: recording stopped: cannot write {record}")
    assert line.endswith("File too large; the job goes on unrecorded")
    summary = summarize_record(record)
    assert not summary.run.complete and summary.run.recording_stopped is None
    story = render_markdown(summary)
    assert "killed?" not in story
    assert "no end line (killed, crashed, or its recording stopped early)" in story


def test_a_recording_stopped_early_is_named_by_its_end_when_the_disk_has_room_again(
    bsmon_dir, tmp_path
):
    result, record = run_full_disk_job(tmp_path, "room")
    stopped_at, ended_at = (int(w) for w in result.stdout.split()[3::3])
    assert len(result.stderr.splitlines()) == 1  # the warning, once
    assert all(p.exists() for p in paths_beside(record))  # the job wrote its summary too
    summary = summarize_record(record)
    assert summary.run.complete and summary.run.end_reason == "closed"
    assert "File too large" in summary.run.recording_stopped
    assert summary.steps == ended_at  # the job's own count, from its end line
    (note,) = [n for n in summary.warnings if n.kind == "recording_stopped"]
    assert f"went on unrecorded to step {ended_at:,}" in note.message
    recorded = int(note.message.rsplit("up to step ", 1)[1].replace(",", ""))
    assert 0 < recorded <= stopped_at
    story = render_markdown(summary)
    assert "ended: closed, but its recording had stopped early" in story
    assert "killed" not in story


# Under bsmon run: the same disk, filled by a script that never imports bsmon.
FULL_DISK_SCRIPT = """
import os, pathlib, resource, signal, torch
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (6000, resource.RLIM_INFINITY))
records = pathlib.Path(os.environ["BSMON_RECORDS_DIR"])
m = torch.nn.Linear(4, 1)
o = torch.optim.SGD(m.parameters(), lr=0.01)
def step():
    m(torch.randn(8, 4)).pow(2).mean().backward(); o.step(); o.zero_grad()
for i in range(500_000):
    step()
    if i % 100 == 0 and any(p.stat().st_size >= 6000 for p in records.glob("*.jsonl")):
        break
for _ in range(100):
    step()
print("job: done")
"""


def test_under_bsmon_run_the_stopped_recording_is_bsmon_runs_line_not_the_jobs(bsmon_dir, tmp_path):
    """The job's output stays the job's: bsmon run says it after the job, from its note."""
    script = tmp_path / "fill.py"
    script.write_text(FULL_DISK_SCRIPT)
    env = {**os.environ, "BSMON_RECORDS_DIR": str(tmp_path / "records")}
    command = [sys.executable, "-m", "bsmon.tui.cli", "run", "--headless", "--name", "fill"]
    try:
        result = subprocess.run(
            [*command, "--", sys.executable, str(script)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        kill_run_processes(bsmon_dir)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "job: done\n"
    (record,) = (tmp_path / "records").glob("*-fill-*.jsonl")
    lines = result.stderr.splitlines()
    assert "RuntimeWarning" not in result.stderr
    assert lines[-2].startswith(f"bsmon: the record of fill: {record} ")
    assert lines[-1] == (
        f"bsmon: fill: recording stopped: cannot write {record}: File too large; "
        "the job went on unrecorded"
    )
