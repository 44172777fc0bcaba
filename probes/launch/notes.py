"""What each process of a ``bsmon run`` job tells ``bsmon run`` about attaching.

The job's own output must stay the job's: a process that cannot attach (a script that updates
its parameters by hand, one that never trains) says so in a small JSON note in the bsmon
directory, not on its stderr. ``bsmon run`` reads the notes of its run (``BSMON_RUN_ID``)
and says in one line why nothing is monitored — on its own stderr, after the job, under
``--headless``, and in the dashboard while it waits. Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ENV_RUN_ID = "BSMON_RUN_ID"  # set by `bsmon run`: the notes of one run share it
NOTES_SUBDIR = "notes"


@dataclass(frozen=True)
class Note:
    pid: int
    attached: bool
    trained: bool  # the process called backward(): it was training, or meant to
    reason: str | None = None  # why it did not attach
    record: str | None = None  # the session record it writes, once attached
    record_stopped: str | None = None  # why its recording stopped before the end, if it did


def _directory(base: Path) -> Path:
    return base / NOTES_SUBDIR


def write(base: Path, run_id: str, note: Note) -> None:
    """Write (or replace) this process's note; never raises."""
    with contextlib.suppress(OSError, ValueError):
        directory = _directory(base)
        directory.mkdir(mode=0o700, exist_ok=True)
        path = directory / f"{run_id}-{note.pid}.json"
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(note.__dict__))
        os.replace(temporary, path)


def read(base: Path, run_id: str) -> list[Note]:
    """The notes of one run (unreadable ones are skipped)."""
    notes = []
    for path in sorted(_directory(base).glob(f"{run_id}-*.json")):
        with contextlib.suppress(OSError, ValueError, TypeError):
            data = json.loads(path.read_text())
            if isinstance(data, Mapping):
                notes.append(Note(**data))
    return notes


def clear(base: Path, run_id: str) -> None:
    for path in _directory(base).glob(f"{run_id}-*.json"):
        with contextlib.suppress(OSError):
            path.unlink()


def why_unmonitored(notes: list[Note]) -> str | None:
    """None when a process of the run attached; else the reason to show (a process that
    trained speaks first), or a general one when no process left a note."""
    if any(note.attached for note in notes):
        return None
    reasons = [n.reason for n in notes if n.trained and n.reason]
    reasons += [n.reason for n in notes if not n.trained and n.reason]
    if reasons:
        return reasons[0]
    return "no process of the command imported torch and stepped a torch.optim optimizer"


def stopped_recordings(notes: list[Note]) -> list[str]:
    """Why the recordings that stopped early stopped (rank 0's first, by pid)."""
    return [n.record_stopped for n in sorted(notes, key=lambda n: n.pid) if n.record_stopped]


def records(notes: list[Note]) -> list[str]:
    """The session records the run's processes write (rank 0's first, by pid)."""
    return [note.record for note in sorted(notes, key=lambda n: n.pid) if note.record]
