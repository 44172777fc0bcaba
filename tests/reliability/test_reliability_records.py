"""Truncated and corrupt records fed to export and replay: a summary, or one RecordError.

A record is cut at a generated offset, has bytes overwritten, or has a line of garbage put in;
``summarize_record`` (what ``bsmon export`` runs) and ``load_replay`` (what ``bsmon replay``
runs) either read it or raise ``RecordError`` — never another exception.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bsmon.probes.record.reader import RecordError
from bsmon.probes.summary.build import summarize_record
from bsmon.tui.replay import load_replay

from ..records import two_phase

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
