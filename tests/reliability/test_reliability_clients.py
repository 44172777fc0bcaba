"""Hostile clients: a hundred idle ones, a thousand that connect and vanish, half-open ones.
The server keeps no trace of the gone, leaks no file descriptor, and the job steps on."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import threading

import pytest

from bsmon.probes import attach
from bsmon.probes.wire import pacing, protocol, server
from bsmon.probes.wire.client import JobConnection
from workloads.reliability_kit import JobProcess, raw_client, read_to_eof

from ..helpers import wait_until
from ..jobs import TinyJob


@pytest.fixture
def served(bsmon_dir):
    job = TinyJob()
    mon = attach(job.model, job.optimizer, batch_size=8, name="clients", record=False)
    yield job, mon
    mon.close()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def steps_and_pings(job, mon, steps: int = 20) -> None:
    before = mon.step
    for _ in range(steps):
        job.step(mon)
    assert mon.flush() and mon.step == before + steps
    assert mon.stats()["errors"] == 0
    with JobConnection(mon.socket_path) as conn:
        assert conn.request(protocol.Ping()).ok


def test_a_hundred_idle_clients_are_all_kept_and_served(served):
    job, mon = served
    idle = [raw_client(mon.socket_path) for _ in range(100)]
    try:
        clients = mon._service.server.clients
        wait_until(lambda: len(clients) == 100, message="100 clients registered")
        steps_and_pings(job, mon, steps=200)
        # none dropped (idle is not misbehaving); the pinging client leaves
        wait_until(lambda: len(clients) == 100, message="the 100 idle clients, and only them")
        for sock in idle[:5]:
            assert b'"type":"hello"' in sock.recv(1 << 16)
    finally:
        for sock in idle:
            sock.close()
    wait_until(lambda: not mon._service.server.clients, message="the idle clients to be gone")


def test_a_thousand_rapid_connects_and_disconnects_leave_nothing_behind(served):
    job, mon = served
    fds_before = open_fds()
    for i in range(1000):
        sock = raw_client(mon.socket_path)
        if i % 2:
            sock.recv(64)  # half of them wait for the first bytes of the greeting
        if i % 3 == 0:
            sock.sendall(b'{"type":"ping","id":1}\n')
        sock.close()
        if i % 100 == 0:
            job.step(mon)
    server = mon._service.server
    wait_until(lambda: not server.clients and not server._tasks, message="all gone")
    wait_until(lambda: open_fds() <= fds_before, message="no descriptor leaked")
    steps_and_pings(job, mon)


def test_a_half_closed_client_gets_its_reply_and_a_half_line_is_no_command(served):
    job, mon = served
    with raw_client(mon.socket_path) as sock:
        sock.sendall(b'{"type":"ping","id":"last"}\n{"type":"ping","id":"cut')
        sock.shutdown(socket.SHUT_WR)  # half-open: it will send nothing more
        lines = [protocol.decode_server_message(line) for line in read_to_eof(sock).splitlines()]
    replies = [m for m in lines if isinstance(m, protocol.Reply)]
    assert [(r.id, r.ok) for r in replies] == [("last", True)]
    steps_and_pings(job, mon)


def test_a_client_stuck_mid_line_holds_nothing_up(served):
    job, mon = served
    with JobConnection(mon.socket_path) as stuck:
        stuck.hello()
        stuck.send_raw(b'{"type":"ping","id":')  # and nothing more, for now
        stuck.pump(0.05)
        steps_and_pings(job, mon, steps=50)
        stuck.send_raw(b'"late"}\n')
        reply = stuck.wait_for(protocol.Reply)
        assert reply.ok and reply.id == "late"  # it was kept, waiting, all along


def test_the_work_budget_waits_only_past_its_share(monkeypatch):
    wall, cpu = [100.0], [7.0]
    monkeypatch.setattr(pacing.time, "monotonic", lambda: wall[0])
    monkeypatch.setattr(pacing.time, "thread_time", lambda: cpu[0])
    budget = pacing.WorkBudget(share=0.2, burst_s=0.05)
    assert budget.wait_s() == 0  # the first call only starts the clocks
    cpu[0] += 0.04
    assert budget.wait_s() == 0  # within the burst
    cpu[0] += 0.06  # 0.1 s of work at once: 0.05 over the burst, paid back at 0.2 s a second
    assert budget.wait_s() == pytest.approx(0.25)
    wall[0] += 0.25
    assert budget.wait_s() == pytest.approx(0)


class CountingBudget(pacing.WorkBudget):
    """The real budget, counting how often the server asked it to pace."""

    def __init__(self) -> None:
        super().__init__()
        self.paces = 0

    async def pace(self) -> None:
        self.paces += 1
        await super().pace()


def test_a_flood_of_bad_lines_is_paced_and_every_line_still_answered(served):
    job, mon = served
    budget = mon._service.server.budget = CountingBudget()
    with JobConnection(mon.socket_path, timeout=30) as conn:
        conn.hello()
        conn.send_raw(b"[1]\n" * 20_000)
        marker = conn.send(protocol.Ping())
        answered = 0
        while (reply := conn.wait_for(protocol.Reply, timeout=60)).id != marker:
            answered += not reply.ok
    assert answered == 20_000
    assert budget.paces >= 20_001  # before every line, the ping included
    steps_and_pings(job, mon)


def open_sockets(pid: int) -> int:
    """How many sockets process ``pid`` holds open (its listener, its loop's, its clients')."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed in between
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    return count


def test_a_client_that_closes_with_replies_unread_prints_nothing_into_the_job(bsmon_dir, processes):
    """2,000 pings sent and the socket closed at once: the replies meet a gone peer. Writing
    them made asyncio log 'socket.send() raised exception.' on the job's stderr (1,995 lines,
    one per write after the fifth). The server now stops answering a peer that is gone, and
    nothing asyncio logs on bsmon's thread reaches the job."""
    job = JobProcess(lambda args: processes.start(args, stdin=subprocess.PIPE, text=True), "unread")
    path = job.wait_ready()
    before = open_sockets(job.process.pid)
    sock = raw_client(path)
    seen = b""
    while b'"type":"metrics"' not in seen:
        seen = seen[-64:] + sock.recv(1 << 16)
    sock.sendall(b'{"type":"ping","id":1}\n' * 2000)
    sock.close()
    wait_until(
        lambda: open_sockets(job.process.pid) == before,
        timeout=60,
        message="the job to be done with the gone client",
    )
    with JobConnection(path) as later:
        assert later.request(protocol.Ping()).ok
    done = job.stop()
    assert job.process.returncode == 0 and done.steps > 0
    assert done.bsmon_samples == done.samples and done.bsmon_errors == 0
    assert job.process.stderr.read() == ""


def test_asyncio_logs_on_bsmons_thread_never_reach_the_jobs_stderr():
    """With no logging configured, the logging module's last resort prints on the process's
    stderr, and a job's own handlers would get it: inside, what the ``asyncio`` logger says on
    this thread (the agent's) reaches no handler; other threads and later keep theirs."""
    heard: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: heard.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("asyncio")
    logger.addHandler(handler)
    try:
        with server.asyncio_logs_kept_from_the_job():
            logger.warning("socket.send() raised exception.")
            other = threading.Thread(target=logger.warning, args=("the job's own",))
            other.start()
            other.join()
        logger.warning("after")
    finally:
        logger.removeHandler(handler)
    assert heard == ["the job's own", "after"]
