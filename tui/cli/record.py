"""``bsmon export`` and ``bsmon replay``: a session record to a summary, or back on screen.

Errors are one line on stderr and exit code 1, like the rest of the command line (this module
prints them itself).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bsmon.probes.record import RecordError
from bsmon.probes.summary import paths_beside, summarize_record, write_summary


def fail(message: str) -> int:
    print(f"bsmon: {message}", file=sys.stderr)
    return 1


def dispatch(args: argparse.Namespace) -> int:
    if args.command == "export":
        return cmd_export(args.record, args.output)
    return cmd_replay(args.record, args.speed)


def cmd_export(record: Path, output: Path | None) -> int:
    try:
        summary = summarize_record(record)
    except RecordError as exc:
        return fail(str(exc))
    for note in summary.warnings:
        if note.kind == "damaged_lines":
            print(f"bsmon: warning: {record}: {note.message}", file=sys.stderr)
    json_path, md_path = (
        paths_beside(record) if output is None else (output / "summary.json", output / "summary.md")
    )
    try:
        write_summary(summary, json_path, md_path, private=output is None)
    except OSError as exc:
        where = output or record.parent
        reason = exc.strerror or str(exc)
        return fail(
            f"cannot write the summary in {where}: {reason} (choose a directory with -o DIR)"
        )
    print(f"wrote {json_path}\nwrote {md_path}")
    return 0


def cmd_replay(record: Path, speed: float | None) -> int:
    from ..app import BsmonApp
    from ..replay import RecordSource, ReplayScreen, load_replay

    try:
        data = load_replay(record)
    except RecordError as exc:
        return fail(str(exc))
    app = BsmonApp(RecordSource(data, speed=speed), dashboard=ReplayScreen, readonly=True)
    if data.damaged is not None:
        app.notify(data.damaged, title="Damaged record", severity="warning", timeout=15)
    app.run()
    if data.damaged is not None:
        print(f"bsmon: warning: {record}: {data.damaged}", file=sys.stderr)
    return app.return_code or 0
