"""Hostile input on the socket: ten thousand generated lines, megabyte lines, binary garbage.

Every line a client sends gets exactly one ``reply`` (blank lines none), the connection stays
open, and the training job steps on unharmed. See docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bsmon.probes import attach
from bsmon.probes.wire import protocol
from bsmon.probes.wire.client import JobConnection
from workloads.reliability_kit import raw_client, read_to_eof

from ..jobs import TinyJob

BATCHES = 100
LINES_PER_BATCH = 100  # 10,000 generated lines in all

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=12),
)
_json = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
_command_like = st.fixed_dictionaries(
    {"type": st.sampled_from([*protocol.CLIENT_COMMANDS, "hello", "", "PING"]) | _json},
    optional={
        "id": _json,
        "value": _scalars,
        "direction": st.sampled_from(["up", "down", "sideways"]) | _scalars,
        "confirm": _scalars,
        "memory_budget": _scalars,
        "timeout_s": _scalars,
    },
)


def _dump(value: object) -> bytes:
    return json.dumps(value).encode()


# one line (no newline inside): JSON shaped like a command, any JSON, or any bytes at all
LINE = st.one_of(
    _command_like.map(_dump),
    _json.map(_dump),
    st.binary(max_size=120),
    st.text(max_size=60).map(lambda s: s.encode("utf-8", "surrogatepass")),
).map(lambda raw: raw.replace(b"\n", b" "))


def replies_until(conn: JobConnection, marker: str) -> list[protocol.Reply]:
    """The replies that arrive before the reply to a ping with id ``marker`` (excluded)."""
    conn.send(protocol.Ping(id=marker))
    replies: list[protocol.Reply] = []
    while True:
        reply = conn.wait_for(protocol.Reply, timeout=30)
        if reply.id == marker:
            return replies
        replies.append(reply)


def test_ten_thousand_generated_lines_each_get_one_reply_and_the_job_steps_on(bsmon_dir):
    job = TinyJob()
    mon = attach(job.model, job.optimizer, batch_size=8, name="hostile", record=False)
    tried: list[int] = []
    with mon, JobConnection(mon.socket_path) as conn:
        conn.hello()

        @settings(
            max_examples=BATCHES,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(st.lists(LINE, min_size=LINES_PER_BATCH, max_size=LINES_PER_BATCH))
        def feed(lines: list[bytes]) -> None:
            conn.send_raw(b"".join(line + b"\n" for line in lines))
            replies = replies_until(conn, uuid.uuid4().hex)
            assert len(replies) == sum(1 for line in lines if line.strip())
            for reply in replies:
                assert reply.ok or (reply.error and len(reply.error) < 1000)
            tried.append(len(lines))
            job.step(mon)

        feed()
        assert conn.request(protocol.Ping()).ok
        assert mon.flush()
        assert mon.stats()["errors"] == 0 and mon.step == len(tried)
    assert sum(tried) >= BATCHES * LINES_PER_BATCH


def send_all_and_read_to_eof(path: os.PathLike[str], data: bytes) -> list[bytes]:
    """Send ``data`` as a raw client (the server may close before taking all of it) and return
    the lines it answered with, up to its end of the connection."""
    with raw_client(path, timeout=30) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(data)
        return read_to_eof(sock).splitlines()


def test_a_two_mebibyte_line_of_garbage_closes_only_its_own_connection(bsmon_dir):
    job = TinyJob()
    mon = attach(job.model, job.optimizer, batch_size=8, name="big", record=False)
    with mon, JobConnection(mon.socket_path) as bystander:
        bystander.hello()
        garbage = os.urandom(2 << 20).replace(b"\n", b"x") + b"\n"
        answer = send_all_and_read_to_eof(mon.socket_path, garbage)
        notice = protocol.decode_server_message(answer[-1])
        assert isinstance(notice, protocol.Notice) and notice.closing
        assert "longer than 1048576 bytes" in notice.message
        for _ in range(5):
            job.step(mon)
        assert mon.flush() and mon.step == 5
        assert bystander.request(protocol.Ping()).ok


def test_binary_garbage_gets_a_reply_per_line_and_the_connection_stays_open(bsmon_dir):
    job = TinyJob()
    garbage = os.urandom(256 << 10)
    lines = garbage.split(b"\n")  # sent with a newline at the end, so the last piece counts
    mon = attach(job.model, job.optimizer, batch_size=8, name="junk", record=False)
    with mon, JobConnection(mon.socket_path) as conn:
        conn.hello()
        conn.send_raw(garbage + b"\n")
        replies = replies_until(conn, "end")
        assert len(replies) == sum(1 for line in lines if line.strip())
        assert replies and all(not r.ok and r.error for r in replies)
        job.step(mon)
        assert mon.flush() and mon.stats()["errors"] == 0


def test_free_text_from_a_client_is_refused_past_its_limit_so_it_cannot_grow_the_job(
    bsmon_dir, tmp_path
):
    """300 `set_batch_size` with a 900 KiB `reason` grew a job by 1 GB and its record by
    264 MB: the reason went whole into the change, its event, the record and every greeting.
    A string a client sends is now refused past ``MAX_TEXT_CHARS`` with a reply naming it."""
    limit = protocol.MAX_TEXT_CHARS
    job = TinyJob()
    record = tmp_path / "text.jsonl"
    mon = attach(job.model, job.optimizer, batch_size=8, name="text", record=record)
    with mon, JobConnection(mon.socket_path) as conn:
        conn.hello()
        huge = "x" * (900 << 10)
        for value in (16, 32) * 10:
            reply = conn.request(protocol.SetBatchSize(value=value, confirm=True, reason=huge))
            assert not reply.ok
            assert (
                reply.error == f"set_batch_size: `reason` must be at most {limit} characters long"
            )
        conn.send_raw(b'{"type":"ping","id":"%s"}\n' % (b"i" * (limit + 1)))
        refused = conn.wait_for(protocol.Reply)
        assert refused.id is None and f"`id` must be at most {limit} characters" in refused.error
        conn.send_raw(b'{"type":"step_batch_size","id":9,"direction":"%s"}\n' % huge.encode())
        refused = conn.wait_matching(lambda m: isinstance(m, protocol.Reply) and m.id == 9, "9")
        assert "must be one of 'up', 'down'" in refused.error and len(refused.error) < 200
        at_limit = "y" * limit
        assert conn.request(protocol.SetBatchSize(value=16, confirm=True, reason=at_limit)).ok
        job.step(mon)
        event = conn.wait_matching(
            lambda m: isinstance(m, protocol.Event) and m.kind == "batch_size", "its event"
        )
        assert at_limit in event.message and len(event.message) < 2 * limit
        assert mon.batch_size == 16
    assert record.stat().st_size < 100_000
