"""Reading records: a torn last line is tolerated; everything else wrong is one clear line."""

from __future__ import annotations

import pytest

from bsmon.probes.record.format import Span
from bsmon.probes.record.reader import RecordError, open_record
from bsmon.probes.summary.build import summarize_record

from ..records import two_phase


def read_all(path):
    with open_record(path) as reader:
        items = list(reader.lines())
    return reader, items


def test_a_whole_record_reads_back_as_written(tmp_path):
    synthetic = two_phase()
    reader, items = read_all(synthetic.write(tmp_path / "r.jsonl"))
    assert reader.header.session.name == "synthetic" and reader.header.version == 1
    assert [i for i in items if isinstance(i, Span)] == synthetic.spans
    assert reader.end is not None and reader.end.step == synthetic.steps
    assert not reader.torn


def test_a_torn_last_line_is_left_out_and_noted(tmp_path):
    synthetic = two_phase(complete=False)
    lines = synthetic.lines()
    last = lines[-1]
    path = tmp_path / "torn.jsonl"
    path.write_bytes(b"".join(lines[:-1]) + last[: len(last) // 2])  # killed mid-write
    reader, items = read_all(path)
    assert reader.torn
    assert len(items) == len(lines) - 2  # the header and the torn line are not items
    summary = summarize_record(path)
    assert summary.source.torn_tail and not summary.run.complete
    kinds = [w.kind for w in summary.warnings]
    assert "torn_line" in kinds and "incomplete" in kinds


def test_a_last_line_without_its_newline_but_whole_still_counts(tmp_path):
    synthetic = two_phase()
    path = synthetic.write(tmp_path / "r.jsonl")
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    reader, _ = read_all(path)
    assert not reader.torn and reader.end is not None


def test_unknown_line_types_are_skipped(tmp_path):
    synthetic = two_phase()
    lines = synthetic.lines()
    lines.insert(3, b'{"type":"from_the_future","x":1}\n')
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"".join(lines))
    reader, _ = read_all(path)
    assert reader.unknown == 1
    assert summarize_record(path).steps == synthetic.steps


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no record at"),
        (b"", "is empty: nothing was recorded"),
        (b'{"type":"record","format":"bsmon-rec', "ends inside its header"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "is not a bsmon record"),
        (b'{"type":"metrics","t":1}\n', "is not a bsmon record"),
        (b'{"type":"record","format":"bsmon-record","version":2}\n', "is a version 2 record"),
        (b'{"type":"record","format":"bsmon-record","version":"one"}\n', "no valid version"),
        (b'{"type":"record","format":"bsmon-record","version":1}\n', "header is corrupt"),
    ],
    ids=[
        "missing",
        "empty",
        "torn-header",
        "binary",
        "other-json",
        "future",
        "bad-version",
        "bad-header",
    ],
)
def test_bad_records_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "r.jsonl"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(RecordError, match=message) as info:
        summarize_record(path)
    assert "\n" not in str(info.value)


def test_a_damaged_line_inside_the_record_is_left_out_and_the_rest_read(tmp_path):
    lines = two_phase().lines()
    whole = tmp_path / "whole.jsonl"
    whole.write_bytes(b"".join(lines))
    steps = summarize_record(whole).steps
    lines[10] = b'{"type":"span","t0":oops}\n'
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"".join(lines))
    summary = summarize_record(path)
    assert summary.warnings[0].kind == "damaged_lines"
    assert summary.warnings[0].message == (
        "line 11 of the record is damaged (not valid JSON); left out, the rest is read"
    )
    assert summary.run.complete  # the end line after it was read
    assert summary.steps == steps  # the step counter is cumulative: the end still has it
    lines[12] = b'{"type":"span","t0":"soon"}\n'
    path.write_bytes(b"".join(lines))
    assert (
        "line 11 and 1 more of the record are damaged" in summarize_record(path).warnings[0].message
    )


def test_a_directory_is_refused_with_a_hint(tmp_path):
    two_phase().write(tmp_path / "20250101-000000-a-1.jsonl")
    with pytest.raises(RecordError, match=r"is a directory, not a record \(the newest record in "):
        summarize_record(tmp_path)
