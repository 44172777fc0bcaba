"""The agent's socket server: many clients, hostile lines, slow readers, foreign users."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from bsmon.probes import attach
from bsmon.probes.wire import protocol
from bsmon.probes.wire.client import ConnectionLost, JobConnection

from ..helpers import repeat_until, wait_until
from ..jobs import TinyJob


@pytest.fixture
def served(bsmon_dir):
    job = TinyJob()
    mon = attach(job.model, job.optimizer, batch_size=8, name="served")
    yield job, mon
    mon.close()


def metrics_in(messages):
    return [m for m in messages if isinstance(m, protocol.Metrics)]


def test_hello_history_and_live_metrics_reach_many_clients(served):
    job, mon = served
    for _ in range(30):
        job.step(mon)
    time.sleep(1.1)  # let one history point (1 s resolution) form
    for _ in range(5):
        job.step(mon)
    assert mon.flush()
    clients = [JobConnection(mon.socket_path) for _ in range(8)]
    try:
        for conn in clients:
            hello = conn.hello()
            assert hello.protocol == protocol.PROTOCOL_VERSION
            assert hello.session.name == "served" and hello.session.pid == os.getpid()
            assert hello.step == 35 and hello.batch_size == 8
            assert hello.capabilities["ping"].available
            history = conn.wait_for(protocol.History)
            assert history.final and history.points and history.points[-1].step >= 30
        for _ in range(10):
            job.step(mon)
        assert mon.flush()
        for conn in clients:
            seen = metrics_in(conn.messages(0.3))
            assert seen and seen[-1].step == 45
            assert conn.request(protocol.Ping()).ok
    finally:
        for conn in clients:
            conn.close()


@pytest.mark.parametrize(
    "line",
    [
        b"this is not json\n",
        b"[]\n",
        b'{"no_type": 1}\n',
        b'{"type": "fly", "id": 1}\n',
        b'{"type": "set_batch_size", "id": 2, "value": "big"}\n',
        b'{"type": "set_batch_size", "id": 3, "value": -1}\n',
        b'{"type": "step_batch_size", "id": 4, "direction": 3}\n',
        b"\x00\x01\x02\xff\n",
    ],
)
def test_each_kind_of_bad_line_gets_a_reply_and_the_connection_stays_open(served, line):
    _, mon = served
    with JobConnection(mon.socket_path) as conn:
        conn.hello()
        conn.send_raw(line)
        reply = conn.wait_for(protocol.Reply)
        assert reply.ok is False and reply.error
        assert conn.request(protocol.Ping()).ok  # still open


def test_blank_lines_are_ignored(served):
    _, mon = served
    with JobConnection(mon.socket_path) as conn:
        conn.hello()
        conn.send_raw(b"\n\n   \n")
        assert conn.request(protocol.Ping()).ok


def test_a_probe_the_job_cannot_run_says_why_and_never_fakes_success(served):
    _, mon = served  # no loss_fn and no batch seen yet
    with JobConnection(mon.socket_path) as conn:
        reply = conn.request(protocol.ProbeCommand())
        assert reply.ok is False and "needs a batch the job has used" in reply.error


def test_an_oversized_line_closes_only_its_own_connection(served):
    job, mon = served
    victim = JobConnection(mon.socket_path)
    bystander = JobConnection(mon.socket_path)
    try:
        victim.hello()
        bystander.hello()
        victim.send_raw(b"x" * (protocol.MAX_LINE_BYTES + 10) + b"\n")
        notice = victim.wait_for(protocol.Notice, timeout=10)
        assert notice.closing and "longer than" in notice.message
        wait_until(lambda: victim.pump(0.05) is not None and victim.eof, message="victim closed")
        job.step(mon)
        assert mon.flush()
        assert bystander.request(protocol.Ping()).ok
    finally:
        victim.close()
        bystander.close()


def test_a_client_that_never_reads_cannot_stall_the_job_or_the_others(served, monkeypatch):
    from bsmon.probes.wire import server

    monkeypatch.setattr(server, "SLOW_CLIENT_BYTES", 16 << 10)
    monkeypatch.setattr(server, "MAX_CONSECUTIVE_DROPS", 5)
    job, mon = served
    sleeper = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sleeper.connect(str(mon.socket_path))  # connects, then never reads a byte
    reader = JobConnection(mon.socket_path)
    clients = mon._service.server.clients
    try:
        reader.hello()
        wait_until(lambda: len(clients) == 2, message="both clients to be registered")
        fat = {f"scalar_{k}": float(k) for k in range(1000)}  # ~25 KB per metrics line
        seen_by_reader = 0

        def step_and_read() -> None:
            nonlocal seen_by_reader
            job.step(mon)
            mon.log(**fat)
            seen_by_reader += len(metrics_in(reader.pump(0.01)))

        repeat_until(step_and_read, lambda: len(clients) == 1, 5000, "the stalled client dropped")
        steps_before = mon.step
        for _ in range(20):
            job.step(mon)
        assert mon.flush()
        assert mon.step == steps_before + 20
        assert seen_by_reader > 0
        assert reader.request(protocol.Ping()).ok
    finally:
        sleeper.close()
        reader.close()


def test_bye_is_sent_when_the_job_closes(served):
    _, mon = served
    with JobConnection(mon.socket_path) as conn:
        conn.hello()
        mon.close("finished")
        bye = conn.wait_for(protocol.Bye)
        assert bye.reason == "finished"
        with pytest.raises(ConnectionLost):
            for _ in range(50):
                conn.pump(0.1)


def test_socket_and_metadata_are_private(served):
    _, mon = served
    assert oct(mon.socket_path.stat().st_mode & 0o777) == oct(0o600)
    assert oct(mon.socket_path.parent.stat().st_mode & 0o777) == oct(0o700)
    assert oct(mon.socket_path.with_suffix(".json").stat().st_mode & 0o777) == oct(0o600)


FOREIGN_CLIENT = """
import os, socket, sys
os.setgid(65534); os.setuid(65534)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(5)
s.connect(sys.argv[1])
data = b""
while not data.endswith(b"\\n"):
    chunk = s.recv(4096)
    if not chunk:
        break
    data += chunk
print(data.decode())
"""


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a client as another uid")
def test_a_peer_of_another_uid_is_refused(served):
    _, mon = served
    directory = mon.socket_path.parent
    os.chmod(directory, 0o711)  # let uid 65534 reach the socket, so SO_PEERCRED is what stops it
    os.chmod(mon.socket_path, 0o666)
    try:
        result = subprocess.run(
            [sys.executable, "-c", FOREIGN_CLIENT, str(mon.socket_path)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        os.chmod(directory, 0o700)
        os.chmod(mon.socket_path, 0o600)
    assert result.returncode == 0, result.stderr
    notice = protocol.decode_server_message(result.stdout.strip())
    assert isinstance(notice, protocol.Notice) and notice.closing
    assert "refused: peer uid 65534" in notice.message
    assert "hello" not in result.stdout
    assert mon._service.server.refused_peers == 1
