"""What earlier runs left in the bsmon directory, cleared when ``bsmon run`` or ``bsmon demo``
starts (never raises; another user's files are never there: the directory is private).

- ``notes/<run-id>-<pid>.json``: ``bsmon run`` clears its run's notes when it ends; one that
  was killed, or whose terminal hung up while the job ran on, leaves them. Notes whose
  ``bsmon run`` (the run id starts with its pid) is gone are removed.
- ``<name>-<pid>.log``: the command's output under a ``bsmon run`` whose command goes on, was
  not monitored, or ended while ``bsmon run`` was killed (one that ended monitored moves
  beside its record; the path is printed), and a killed ``bsmon demo``'s. The newest
  ``KEEP_LOGS`` stay; older ones whose process is gone are removed.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

from bsmon.probes.launch import notes as run_notes
from bsmon.probes.wire import discovery

KEEP_LOGS = 20
_NOTE = re.compile(r"^(\d+)-[0-9a-f]+-\d+\.(json|tmp)$")
_LOG = re.compile(r"-(\d+)\.log$")


def _gone(pid_text: str) -> bool:
    return not discovery.pid_alive(int(pid_text))


def stale_notes(directory: Path) -> list[Path]:
    found = []
    with contextlib.suppress(OSError):
        for path in (directory / run_notes.NOTES_SUBDIR).iterdir():
            match = _NOTE.match(path.name)
            if match and _gone(match.group(1)):
                found.append(path)
    return found


def old_logs(directory: Path, keep: int = KEEP_LOGS) -> list[Path]:
    logs = []
    with contextlib.suppress(OSError):
        for path in directory.glob("*.log"):
            with contextlib.suppress(OSError):
                logs.append((path.stat().st_mtime, path))
    logs.sort(reverse=True)
    return [
        path
        for _, path in logs[keep:]
        if (match := _LOG.search(path.name)) is not None and _gone(match.group(1))
    ]


def tidy(directory: Path, keep_logs: int = KEEP_LOGS) -> None:
    for path in [*stale_notes(directory), *old_logs(directory, keep_logs)]:
        with contextlib.suppress(OSError):
            path.unlink()
