"""``bsmon records [--json]``: the session records kept on this machine, newest first.

Each record's name, start, steps, size and path, read from its summary when one was written
beside it (the record's own header otherwise). A record that cannot be read is listed with
the reason, never skipped: the point is to find them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bsmon.probes.record import RecordError
from bsmon.probes.summary import paths_beside, summarize_record
from bsmon.probes.wire import discovery

from .. import format as fmt


@dataclass(frozen=True)
class RecordRow:
    path: str
    name: str
    started: float | None
    steps: int | None
    size: int
    problem: str | None = None


def read_row(path: Path) -> RecordRow:
    size = path.stat().st_size
    summary_json = paths_beside(path)[0]
    try:
        if summary_json.exists():
            data = json.loads(summary_json.read_text())
            run = data["run"]
            return RecordRow(str(path), run["name"], run["start_time"], data["steps"], size)
        summary = summarize_record(path)
        run = summary.run
        return RecordRow(str(path), run.name, run.start_time, summary.steps, size)
    except (RecordError, OSError, ValueError, KeyError, TypeError) as exc:
        return RecordRow(str(path), path.stem, None, None, size, str(exc))


def list_records(directory: Path) -> list[RecordRow]:
    paths = sorted(directory.glob("*.jsonl"), key=lambda p: p.stat().st_mtime, reverse=True)
    return [read_row(path) for path in paths]


def say_record(name: str, path: str | Path) -> None:
    """One line on stderr, when a session ends: where its record is."""
    print(
        f"bsmon: the record of {name}: {path} (`bsmon replay` or `bsmon export` it)",
        file=sys.stderr,
    )


def say_record_of(name: str, pid: int) -> None:
    """Where the record of the job ``pid`` is (nothing if it has none)."""
    found = sorted(discovery.records_dir().glob(f"*-{pid}.jsonl"), key=lambda p: p.stat().st_mtime)
    if found:
        say_record(name, found[-1])


def say_shown_record(source: object) -> None:
    """Where the record of the job a dashboard showed is (nothing if it never attached, or the
    job writes none)."""
    model = getattr(source, "model", None)
    hello = getattr(model, "hello", None)
    if hello is not None and hello.session.record:
        say_record(hello.session.name, hello.session.record)


def cmd_records(args: argparse.Namespace, directory: Path) -> int:
    rows = list_records(directory) if directory.is_dir() else []
    if args.json:
        print(json.dumps([asdict(row) for row in rows], indent=1))
        return 0
    if not rows:
        print(f"no records in {directory} (a job writes its record there as it runs)")
        return 0
    print(f"records in {directory}, newest first (`bsmon export` or `bsmon replay` one):")
    print(f"{'NAME':<20} {'STARTED':<16} {'STEPS':>9} {'SIZE':>9}  RECORD")
    for row in rows:
        started = "?"
        if row.started is not None:
            started = time.strftime("%Y-%m-%d %H:%M", time.localtime(row.started))
        print(
            f"{row.name[:20]:<20} {started:<16}"
            f" {f'{row.steps:,}' if row.steps is not None else '?':>9} {fmt.bytes_(row.size):>9}"
            f"  {row.path}{f'  ({row.problem})' if row.problem else ''}"
        )
    return 0
