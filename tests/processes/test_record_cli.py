"""``bsmon export`` and ``bsmon replay`` on the command line: output, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bsmon.probes.record.format import RECORD_VERSION

from ..helpers import ROOT
from ..records import two_phase
from ..tmux import Tmux


def bsmon(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bsmon.tui.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def one_line_error(result: subprocess.CompletedProcess, code: int) -> str:
    assert result.returncode == code, result
    assert result.stdout == "" and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bsmon: "), result.stderr
    return lines[0]


def test_export_writes_beside_the_record_by_default(tmp_path):
    record = two_phase().write(tmp_path / "run.jsonl")
    result = bsmon("export", str(record))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"wrote {tmp_path}/run.summary.json",
        f"wrote {tmp_path}/run.summary.md",
    ]
    assert json.loads((tmp_path / "run.summary.json").read_text())["steps"] == 1500


def test_export_of_a_record_with_a_damaged_line_warns_and_writes_the_rest(tmp_path):
    lines = two_phase().lines()
    record = write(tmp_path / "run.jsonl", b"".join(lines[:5]) + b"garbage\n" + b"".join(lines[5:]))
    result = bsmon("export", str(record))
    assert result.returncode == 0, result.stderr
    assert result.stderr == (
        f"bsmon: warning: {record}: line 6 of the record is damaged (not valid JSON); left out, "
        "the rest is read\n"
    )
    data = json.loads((tmp_path / "run.summary.json").read_text())
    assert data["warnings"][0]["kind"] == "damaged_lines" and data["run"]["complete"]
    assert "line 6 of the record is damaged" in (tmp_path / "run.summary.md").read_text()


def test_export_to_a_directory_it_creates(tmp_path):
    record = two_phase().write(tmp_path / "run.jsonl")
    result = bsmon("export", str(record), "-o", str(tmp_path / "a" / "b"))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "a" / "b").iterdir()) == [
        "summary.json",
        "summary.md",
    ]


def test_export_of_a_torn_record_works(tmp_path):
    record = two_phase(complete=False).write(tmp_path / "run.jsonl", tail=b'{"type":"span","t0":17')
    assert bsmon("export", str(record)).returncode == 0
    data = json.loads((tmp_path / "run.summary.json").read_text())
    assert data["source"]["torn_tail"] is True and data["run"]["complete"] is False


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: d / "missing.jsonl", "bsmon: no record at {path}"),
        (lambda d: d, "bsmon: {path} is a directory, not a record"),
        (
            lambda d: write(
                d / "x.jsonl", b'{"type":"record","format":"bsmon-record","version":99}\n'
            ),
            f"bsmon: {{path}} is a version 99 record; this bsmon reads versions up to "
            f"{RECORD_VERSION} (upgrade bsmon to read it)",
        ),
        (lambda d: write(d / "x.jsonl", b"hello\n"), "bsmon: {path} is not a bsmon record"),
    ],
    ids=["missing", "directory", "future-version", "not-a-record"],
)
@pytest.mark.parametrize("command", ["export", "replay"])
def test_bad_records_are_one_line_errors_with_exit_1(tmp_path, setup, message, command):
    path = setup(tmp_path)
    line = one_line_error(bsmon(command, str(path)), 1)
    assert line.startswith(message.format(path=path))


def write(path, data: bytes):
    path.write_bytes(data)
    return path


def test_export_to_an_unwritable_place_says_so(tmp_path):
    record = two_phase().write(tmp_path / "run.jsonl")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    line = one_line_error(bsmon("export", str(record), "-o", str(blocker / "out")), 1)
    assert f"cannot write the summary in {blocker / 'out'}" in line and "-o DIR" in line


@pytest.mark.parametrize(
    "args",
    [
        ["export"],
        ["replay"],
        ["export", "a.jsonl", "b.jsonl"],
        ["export", "a.jsonl", "-o"],
        ["replay", "a.jsonl", "--speed", "0"],
        ["replay", "a.jsonl", "--speed", "fast"],
        ["replay", "a.jsonl", "--speed", "nan"],
    ],
)
def test_wrong_arguments_are_one_line_and_exit_2(args):
    one_line_error(bsmon(*args), 2)


def test_replay_in_a_real_terminal_shows_the_run_and_quits(tmp_path):
    record = two_phase().write(tmp_path / "run.jsonl")
    tmux = Tmux(100, 30)
    env = {"LANG": "C.UTF-8", "TERM": "xterm-256color"}
    try:
        tmux.start(f"{sys.executable} -m bsmon.tui.cli replay {record} --speed 1000", ROOT, env)
        screen = tmux.wait_for(
            lambda s: "REPLAY" in s and "the job finished (closed)" in s,
            timeout=60,
            what="the replay to reach the end of the run",
        )
        assert "synthetic" in screen and "step 1,500" in screen
        tmux.send("q")
        tmux.wait_for(lambda s: "BSMON-EXITED-0" in s, timeout=30, what="bsmon to exit with 0")
    finally:
        tmux.kill()


def test_records_are_kept_where_they_survive_logout_and_reboot(monkeypatch, tmp_path):
    from bsmon.probes.wire import discovery

    monkeypatch.delenv("BSMON_DIR", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))  # a tmpfs: not for records
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert discovery.records_dir() == tmp_path / "data" / "bsmon" / "records"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert discovery.records_dir() == tmp_path / "home" / ".local/share/bsmon/records"
    monkeypatch.setenv("BSMON_DIR", str(tmp_path / "mine"))
    assert discovery.records_dir() == tmp_path / "mine" / "records"


def test_bsmon_records_lists_them_newest_first_and_a_damaged_one_with_its_reason(bsmon_dir):
    import os

    records = bsmon_dir / "records"
    records.mkdir()
    older = two_phase().write(records / "older.jsonl")
    os.utime(older, (1, 1))
    newer = two_phase().write(records / "newer.jsonl")
    (records / "broken.jsonl").write_text("not a record\n")
    os.utime(records / "broken.jsonl", (0, 0))
    listed = bsmon("records", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [row["path"] for row in rows] == [
        str(newer),
        str(older),
        str(records / "broken.jsonl"),
    ]
    assert rows[0]["steps"] > 0 and rows[0]["problem"] is None
    assert "not a bsmon record" in rows[2]["problem"]
    text = bsmon("records")
    assert text.returncode == 0 and str(newer) in text.stdout and "STEPS" in text.stdout


def test_bsmon_records_says_where_it_looked_when_there_are_none(bsmon_dir):
    result = bsmon("records")
    assert result.returncode == 0
    assert result.stdout.strip() == (
        f"no records in {bsmon_dir / 'records'} (a job writes its record there as it runs)"
    )


async def test_a_dashboard_that_ends_says_where_the_record_of_its_job_is(capsys):
    """`bsmon attach` and plain `bsmon` on their way out (the job may run on)."""
    from bsmon.tui.app import BsmonApp
    from bsmon.tui.cli.records import say_shown_record
    from bsmon.tui.sources import ScriptedSource

    from ..scripted import messages

    script = messages(gpu=False)
    script[0].session.record = "/data/bsmon/records/20260101-000000-resnet-cifar-4242.jsonl"
    app = BsmonApp(ScriptedSource("resnet-cifar", script))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
    say_shown_record(app.source)
    assert capsys.readouterr().err == (
        "bsmon: the record of resnet-cifar: /data/bsmon/records/20260101-000000-resnet-cifar-"
        "4242.jsonl (`bsmon replay` or `bsmon export` it)\n"
    )
    say_shown_record(BsmonApp(ScriptedSource("nobody", [])).source)  # never attached: nothing
    assert capsys.readouterr().err == ""
