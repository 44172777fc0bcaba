"""Stopping a job's process group: SIGINT, then SIGTERM, then SIGKILL after a grace period
each, at once when asked again (a second Ctrl-C), on real processes."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from bsmon.probes.wire.discovery import JobEntry
from bsmon.tui.cli.family import JobFinder, pick
from bsmon.tui.cli.stopping import GroupStop, wait_for

# The child takes Ctrl-C as one started from a terminal does, also when the tests themselves
# run as a shell's background job (which starts with SIGINT ignored, and passes that on).
IGNORING = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
for name in sys.argv[1:]:
    signal.signal(getattr(signal, name), signal.SIG_IGN)
print("ready", flush=True)
time.sleep(600)
"""


def stubborn(processes, *ignored: str) -> subprocess.Popen:
    """A process (leading its own group) that ignores ``ignored``, once it does."""
    process = processes.python("-c", IGNORING, *ignored, text=True)
    assert process.stdout.readline().strip() == "ready"
    return process


def wait_code(stop: GroupStop, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return stop.wait_once()
        except subprocess.TimeoutExpired:
            continue
    raise AssertionError(f"the process did not end within {timeout} s")


def test_ctrl_c_comes_first_and_is_enough_for_a_process_that_takes_it(processes, capsys):
    process = stubborn(processes)
    stop = GroupStop(process, "job", grace_s=30)
    stop.escalate()
    assert wait_code(stop, 20) == -signal.SIGINT
    assert "bsmon: stopping job: Ctrl-C (SIGINT) sent; SIGTERM in 30 s, or at Ctrl-C" in (
        capsys.readouterr().err
    )


def test_the_ladder_climbs_by_itself_after_the_grace_period(processes, capsys):
    process = stubborn(processes, "SIGINT", "SIGTERM")
    stop = GroupStop(process, "job", grace_s=0.5)
    started = time.monotonic()
    stop.escalate()
    assert wait_code(stop, 30) == -signal.SIGKILL
    assert time.monotonic() - started >= 1.0  # two grace periods: SIGTERM, then SIGKILL
    err = capsys.readouterr().err
    assert "SIGTERM sent; SIGKILL in 0.5 s" in err and "stopping job: SIGKILL sent\n" in err


def test_a_second_ctrl_c_climbs_at_once(processes):
    process = stubborn(processes, "SIGINT")
    stop = GroupStop(process, "job", grace_s=600)
    stop.escalate()
    stop.escalate()  # what the second Ctrl-C does
    assert wait_code(stop, 20) == -signal.SIGTERM


def test_a_signal_from_outside_starts_the_ladder_where_it_is(processes, capsys):
    process = stubborn(processes, "SIGINT", "SIGTERM")
    assert wait_for(process, "job", first=signal.SIGTERM, grace_s=0.3) == -signal.SIGKILL
    err = capsys.readouterr().err
    assert "SIGINT" not in err and "SIGTERM sent; SIGKILL in 0.3 s" in err


def test_nothing_is_sent_to_a_process_that_has_ended(processes, capsys):
    process = processes.python("-c", "pass")
    process.wait(30)
    stop = GroupStop(process, "job")
    stop.escalate()
    assert stop.rung == -1 and capsys.readouterr().err == ""


def job(pid: int, name: str) -> JobEntry:
    return JobEntry(socket=f"/x/{pid}.sock", pid=pid, name=name, host="h", start_time=None)  # type: ignore[arg-type]


def test_rank_0_is_opened_first_whatever_serves_first():
    r0, r1 = job(20, "ddp"), job(10, "ddp-rank1")
    assert pick([r1, r0], {10: 1, 20: 0}, "ddp") == (r0, True)
    assert pick([r1], {10: 1}, "ddp") == (r1, False)
    plain = job(5, "train")  # no RANK: a single process is its own rank 0
    assert pick([plain], {5: None}, "train") == (plain, True)
    assert pick([], {}, "train") == (None, False)


@pytest.mark.parametrize("late", [False, True])
def test_the_finder_waits_for_rank_0_then_takes_what_serves(monkeypatch, late):
    from bsmon.tui.cli import family

    now = [0.0]
    serving = [job(10, "ddp-rank1")]
    monkeypatch.setattr(family, "family_of", lambda pid: {10, 20})
    monkeypatch.setattr(family, "rank_of", lambda pid: {10: 1, 20: 0}[pid])
    monkeypatch.setattr(family.discovery, "iter_jobs", lambda directory: iter(serving))
    find = JobFinder(1, "ddp", "/x", rank0_wait_s=60, clock=lambda: now[0])  # type: ignore[arg-type]
    assert find() is None and find.waiting_for_rank0
    now[0] = 59.0
    assert find() is None
    if late:  # rank 0 never came: rank 1 is better than nothing
        now[0] = 61.0
        assert find() == serving[0].socket and not find.waiting_for_rank0
    else:
        serving.append(job(20, "ddp"))
        assert find() == serving[1].socket and not find.waiting_for_rank0
