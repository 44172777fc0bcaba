"""The ``bsmon`` command line's arguments, ``main`` and the dispatch to each command.

Wrong arguments print one line and exit with code 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from bsmon.probes import __version__
from bsmon.probes.wire import discovery

from ..errors import EXIT_USAGE, CliError
from ..settings import MAX_INTERVAL_S, MIN_INTERVAL_S, Mode, settings
from .attach import cmd_attach, cmd_dashboard
from .jobs import cmd_list
from .run import add_parser as add_run_parser

MODES: dict[str, Mode] = {"demo": "demo", "run": "run", "replay": "replay"}


EXAMPLES = """\
examples:
  bsmon demo                           a demo job and its dashboard (q or Ctrl-C stops both)
  bsmon run -- python train.py         run a script, unchanged, with the dashboard on it
  bsmon run -- torchrun --nproc-per-node 2 train.py
  bsmon                                attach to the running job (a picker when several)
  bsmon records                        the session records kept here, newest first
  bsmon export RECORD                  its summary.md and summary.json

Dashboard keys: ? help, q or Ctrl-C quit (under bsmon run and bsmon demo: stops the job;
d detaches from a bsmon run job and leaves it running).
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see `{self.prog} --help`)", EXIT_USAGE)


def _add_global_options(
    parser: argparse.ArgumentParser,
    default: object,
    names: tuple[str, ...] = ("readonly", "dir", "interval"),
) -> None:
    """``--readonly``, ``--dir`` and ``--interval``, before or after the subcommand (a
    subcommand's copy leaves what was given before it alone unless given again); ``names``:
    the ones that mean something to that subcommand."""
    if "readonly" in names:
        parser.add_argument(
            "--readonly",
            action="store_true",
            default=default if default is argparse.SUPPRESS else False,
            help="disable every command that acts on the job",
        )
    if "dir" in names:
        parser.add_argument(
            "--dir",
            type=Path,
            default=default,
            help=f"where jobs put their sockets (default: ${discovery.ENV_DIR}, "
            "else $XDG_RUNTIME_DIR/bsmon, else /tmp/bsmon-$UID)",
        )
    if "interval" in names:
        _add_interval(parser, default)


def _add_interval(parser: argparse.ArgumentParser, default: object) -> None:
    parser.add_argument(
        "--interval",
        type=_interval,
        default=default,
        metavar="SECONDS",
        help="how often the dashboard redraws (default 1; the [ and ] keys change it)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="bsmon",
        description="Live monitor for PyTorch training jobs.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"bsmon {__version__}")
    _add_global_options(parser, None)
    common = _Parser(add_help=False)
    _add_global_options(common, argparse.SUPPRESS)
    viewing = _Parser(add_help=False)  # a record on screen: only the redraw interval matters
    _add_global_options(viewing, argparse.SUPPRESS, ("interval",))
    listing = _Parser(add_help=False)  # no dashboard, nothing acted on: only where jobs are
    _add_global_options(listing, argparse.SUPPRESS, ("dir",))
    probing = _Parser(add_help=False)  # no dashboard (--readonly refuses the probe)
    _add_global_options(probing, argparse.SUPPRESS, ("readonly", "dir"))
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    p = sub.add_parser("list", parents=[listing], help="list running jobs")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("attach", parents=[common], help="open the dashboard on one job")
    p.add_argument("target", help="job name, pid, or socket path")

    p = sub.add_parser(
        "probe", parents=[probing], help="probe a job's largest batch size in a sidecar process"
    )
    p.add_argument("target", help="job name, pid, or socket path")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument(
        "--memory-budget",
        type=_bytes_argument,
        default=None,
        metavar="BYTES",
        help="on the CPU: the memory the sidecar may use (e.g. 2G, 512M, 1000000)",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds (default 600)")

    p = sub.add_parser(
        "demo", parents=[common], help="start a demo training job and open the dashboard on it"
    )
    p.add_argument("--headless", action="store_true", help="run only the job, no dashboard")
    p.add_argument("--steps", type=int, default=0, help="stop the job after N steps")
    p.add_argument("--name", default="demo", help="the demo job's name (default: demo)")
    p.add_argument(
        "--batch-size", type=int, default=64, help="the batch size it starts at (default: 64)"
    )
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument(
        "--model",
        choices=("cnn", "lm"),
        default="cnn",
        help="cnn: a CNN on images (default); lm: a small transformer on text (tokens/s, MFU)",
    )

    p = sub.add_parser("export", help="write summary.json and summary.md of a session record")
    p.add_argument("record", type=Path, help="a record (.jsonl): `bsmon records` lists them")
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        metavar="DIR",
        help="where to write them (default: beside the record, as <record>.summary.*)",
    )

    p = sub.add_parser(
        "replay", parents=[viewing], help="open the dashboard on a recorded session (read-only)"
    )
    p.add_argument("record", type=Path, help="a record (.jsonl)")
    p.add_argument(
        "--speed",
        type=_positive_float,
        default=None,
        help="seconds of the run per second (default: the whole run in about 30 s)",
    )

    p = sub.add_parser(
        "records",
        help="list the session records kept on this machine, newest first",
        description="List the session records in $BSMON_DIR/records, else "
        "$XDG_DATA_HOME/bsmon/records (~/.local/share/bsmon/records).",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")

    add_run_parser(sub, [common])
    return parser


def _interval(text: str) -> float:
    value = _positive_float(text)
    if not MIN_INTERVAL_S <= value <= MAX_INTERVAL_S:
        raise argparse.ArgumentTypeError(
            f"must be from {MIN_INTERVAL_S:g} to {MAX_INTERVAL_S:g} seconds, got {text}"
        )
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse(build_parser(), argv)
        if args.dir is not None:
            os.environ[discovery.ENV_DIR] = str(args.dir)
        if args.interval is not None:
            settings.interval_s = args.interval
        settings.mode = MODES.get(args.command or "", "attach")
        return dispatch(args)
    except CliError as exc:
        print(f"bsmon: {exc}", file=sys.stderr)
        return exc.code
    except discovery.BsmonDirError as exc:
        print(f"bsmon: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parser.parse_args``, but an unknown option is the subcommand's to name, so that its
    error points to that subcommand's help (`bsmon run --help`), as a bad value's does."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        owner = _subcommand_parser(parser, args.command) or parser
        owner.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def _subcommand_parser(
    parser: argparse.ArgumentParser, command: str | None
) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(command)  # type: ignore[arg-type]
    return None


def dispatch(args: argparse.Namespace) -> int:
    command = args.command
    if command == "list":
        return cmd_list(args.json)
    if command == "attach":
        return cmd_attach(args.target, readonly=args.readonly)
    if command == "demo":
        from .demo import run_demo

        return run_demo(args)
    if command == "run":
        from .run import run

        return run(args, readonly=args.readonly)
    if command == "probe":
        if args.readonly:
            raise CliError("--readonly: the probe acts on the job's device", EXIT_USAGE)
        from .probe import run_probe

        return run_probe(
            args.target, as_json=args.json, memory_budget=args.memory_budget, timeout=args.timeout
        )
    if command == "records":
        from .records import cmd_records

        return cmd_records(args, discovery.records_dir())
    if command in ("export", "replay"):
        from . import record

        return record.dispatch(args)
    return cmd_dashboard(readonly=args.readonly)


_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _bytes_argument(text: str) -> int:
    """A byte count: 1000000, 512M, 2G, 1.5GiB."""
    cleaned = text.strip().upper().removesuffix("IB").removesuffix("B")
    suffix = cleaned[-1:] if cleaned[-1:] in _SUFFIXES else ""
    try:
        value = float(cleaned.removesuffix(suffix)) * _SUFFIXES[suffix]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a byte count: {text!r} (try 2G or 512M)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"the memory budget must be positive, got {text!r}")
    return int(value)
