"""``bsmon export`` and ``bsmon replay``: a session record to a summary, or back on screen."""

from __future__ import annotations

import argparse
from pathlib import Path

from bsmon.probes.record_reader import RecordError
from bsmon.probes.summary import paths_beside, summarize_record, write_summary

from .cli import CliError


def dispatch(args: argparse.Namespace) -> int:
    if args.command == "export":
        return cmd_export(args.record, args.output)
    return cmd_replay(args.record, args.speed)


def cmd_export(record: Path, output: Path | None) -> int:
    try:
        summary = summarize_record(record)
    except RecordError as exc:
        raise CliError(str(exc)) from None
    json_path, md_path = (
        paths_beside(record) if output is None else (output / "summary.json", output / "summary.md")
    )
    try:
        write_summary(summary, json_path, md_path)
    except OSError as exc:
        where = output or record.parent
        raise CliError(
            f"cannot write the summary in {where}: {exc.strerror or exc} (choose a directory "
            "with -o DIR)"
        ) from None
    print(f"wrote {json_path}\nwrote {md_path}")
    return 0


def cmd_replay(record: Path, speed: float | None) -> int:
    from .app import BsmonApp
    from .replay import RecordSource, ReplayScreen, load_replay

    try:
        data = load_replay(record)
    except RecordError as exc:
        raise CliError(str(exc)) from None
    app = BsmonApp(RecordSource(data, speed=speed), dashboard=ReplayScreen, readonly=True)
    app.run()
    return app.return_code or 0
