"""The session a job describes in its hello and record says whether bsmon run attached it."""

from __future__ import annotations

import msgspec

from bsmon.probes.runtime import audience
from bsmon.probes.runtime.session import session_info
from bsmon.probes.wire import protocol


def test_the_session_says_whether_bsmon_run_attached_the_agent():
    assert session_info("plain").zero_code is False
    audience.set_zero_code(True)
    try:
        assert session_info("run").zero_code is True
    finally:
        audience.set_zero_code(False)


def test_a_session_from_an_older_job_without_the_field_reads_as_attached():
    session = protocol.SessionInfo("old", 1, "h", [], 0.0, "3", "2", "0.1")
    raw = msgspec.json.encode(session).replace(b',"zero_code":false', b"")
    assert b"zero_code" not in raw
    assert msgspec.json.decode(raw, type=protocol.SessionInfo).zero_code is False
