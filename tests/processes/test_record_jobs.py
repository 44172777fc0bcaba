"""Real jobs in subprocesses: killed, closed, exiting, terminated — each leaves its record
(and, when it can, its summary) behind."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec

from bsmon.probes.summary.build import paths_beside, summarize_record
from bsmon.probes.summary.schema import Summary

from ..helpers import wait_until

JOB = """
import signal, sys, time, torch
from bsmon.probes import attach
mode = sys.argv[1]
if mode == "own-handler":
    def handler(signum, frame):
        print("handled", flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, handler)
if mode == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
m = torch.nn.Linear(4, 1)
o = torch.optim.SGD(m.parameters(), lr=0.01)
mon = attach(m, o, batch_size=8, name="job-" + mode)
print("record", mon.session.record, flush=True)
deadline = time.time() + 120
while time.time() < deadline:
    m(torch.randn(8, 4)).pow(2).mean().backward()
    o.step()
    o.zero_grad()
    sys.stdout.write(f"step {time.time()!r} {mon.step}\\n")  # one write: a handler cannot split it
    sys.stdout.flush()
    if mode in ("close", "exit") and mon.step >= 100:
        break
    time.sleep(0.002)
if mode == "close":
    mon.close()
"""


class Job:
    """A training job in a subprocess whose stdout is read on a thread (timestamped steps)."""

    def __init__(self, processes, mode: str) -> None:
        self.process = processes.python("-c", JOB, mode, text=True)
        self.steps: list[tuple[float, int]] = []
        self.lines: list[str] = []
        self.record: Path | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            parts = line.split()
            if not line.endswith("\n"):
                continue  # the last line of a killed job may be cut short
            if parts[:1] == ["step"] and len(parts) == 3:
                self.steps.append((float(parts[1]), int(parts[2])))
            elif parts[:1] == ["record"] and len(parts) == 2:
                self.record = Path(parts[1])
            else:
                self.lines.append(line.strip())

    def wait_steps(self, seconds: float) -> None:
        wait_until(
            lambda: self.steps and self.steps[-1][0] - self.steps[0][0] >= seconds,
            message=f"{seconds} s of steps",
            progress=lambda: len(self.steps),
        )

    def finish(self, timeout: float = 60) -> int:
        code = self.process.wait(timeout)
        self._reader.join(10)
        return code

    def steps_before(self, t: float) -> int:
        return max((step for when, step in self.steps if when <= t), default=0)


def summary_beside(record: Path) -> Summary:
    json_path, md_path = paths_beside(record)
    assert md_path.exists()
    return msgspec.json.decode(json_path.read_bytes(), type=Summary)


def test_a_killed_job_leaves_a_record_that_exports_with_its_steps(bsmon_dir, processes):
    job = Job(processes, "kill")
    job.wait_steps(2.5)
    killed_at = time.time()
    job.process.kill()  # SIGKILL: no close, no atexit, no summary
    assert job.finish() == -signal.SIGKILL
    assert job.record is not None and job.record.parent == bsmon_dir / "records"
    assert not paths_beside(job.record)[0].exists()
    summary = summarize_record(job.record)
    made_a_second_before = job.steps_before(killed_at - 1.0)
    assert made_a_second_before > 0
    assert summary.steps >= made_a_second_before
    assert summary.steps <= job.steps[-1][1]
    assert not summary.run.complete and summary.run.end_reason is None
    assert "incomplete" in [w.kind for w in summary.warnings]


def test_close_writes_the_summary_beside_the_record(bsmon_dir, processes):
    job = Job(processes, "close")
    assert job.finish() == 0
    summary = summary_beside(job.record)
    assert summary.steps == 100 and summary.run.complete and summary.run.end_reason == "closed"


def test_normal_interpreter_exit_writes_the_summary(bsmon_dir, processes):
    job = Job(processes, "exit")
    assert job.finish() == 0
    summary = summary_beside(job.record)
    assert summary.steps == 100 and summary.run.end_reason == "the job exited"


def test_sigterm_writes_the_summary_and_still_kills_the_job_with_sigterm(bsmon_dir, processes):
    job = Job(processes, "term")
    job.wait_steps(1.0)
    job.process.send_signal(signal.SIGTERM)
    assert job.finish() == -signal.SIGTERM  # as if bsmon were not there
    summary = summary_beside(job.record)
    assert summary.run.end_reason == "terminated (SIGTERM)"
    assert summary.steps >= job.steps[-1][1] - 1  # at most the step in flight is missing


def test_a_jobs_own_sigterm_handler_is_kept(bsmon_dir, processes):
    job = Job(processes, "own-handler")
    job.wait_steps(0.5)
    job.process.send_signal(signal.SIGTERM)
    assert job.finish() == 0
    assert "handled" in job.lines  # the job's handler ran, not bsmon's
    summary = summary_beside(job.record)  # written by close() at exit
    assert summary.run.end_reason == "the job exited" and summary.steps > 0


def test_a_job_that_ignores_sigterm_still_ignores_it(bsmon_dir, processes):
    job = Job(processes, "ignore")
    job.wait_steps(0.5)
    job.process.send_signal(signal.SIGTERM)
    seen = len(job.steps)
    wait_until(
        lambda: len(job.steps) > seen + 50,
        message="steps after SIGTERM",
        progress=lambda: len(job.steps),
    )
    assert job.process.poll() is None
    job.process.kill()
    job.finish()


def test_export_from_the_command_line_of_a_killed_jobs_record(bsmon_dir, processes, tmp_path):
    job = Job(processes, "kill")
    job.wait_steps(1.5)
    job.process.kill()
    job.finish()
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "bsmon.tui.cli", "export", str(job.record), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"wrote {out}/summary.json", f"wrote {out}/summary.md"]
    assert msgspec.json.decode((out / "summary.json").read_bytes(), type=Summary).steps > 0
