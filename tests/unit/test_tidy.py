"""What killed runs leave in the bsmon directory is cleared: notes of runs that are gone, and
logs beyond the newest 20 whose process is gone; nothing of a live process is touched."""

from __future__ import annotations

import os
import subprocess
import sys

from bsmon.tui.cli.tidy import tidy


def dead_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(done.stdout)


def test_notes_of_runs_that_are_gone_are_removed(tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    dead, live = dead_pid(), os.getpid()
    gone = notes / f"{dead}-0a1b2c3d-777.json"
    mine = notes / f"{live}-0a1b2c3d-778.json"
    other = notes / "someone-elses.json"
    for path in (gone, mine, other):
        path.write_text("{}")
    tidy(tmp_path)
    assert sorted(p.name for p in notes.iterdir()) == sorted([mine.name, other.name])


def test_logs_beyond_the_newest_are_removed_unless_their_process_lives(tmp_path):
    dead, live = dead_pid(), os.getpid()
    logs = []
    for age in range(25):  # 0 is the newest
        pid = live if age == 24 else dead  # the oldest, but its bsmon run lives
        path = tmp_path / f"train{age:02d}-{pid}.log"
        path.write_text("output\n")
        os.utime(path, (1000 - age, 1000 - age))
        logs.append(path)
    (tmp_path / "notes.txt").write_text("not a log")
    tidy(tmp_path, keep_logs=20)
    kept = {p.name for p in tmp_path.glob("*.log")}
    assert kept == {p.name for p in logs[:20]} | {f"train24-{live}.log"}
    assert (tmp_path / "notes.txt").exists()
