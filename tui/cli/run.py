"""``bsmon run [--name N] [--headless] [--log FILE] -- CMD ...``: run a training command that
nobody changed, with bsmon attached, and show it.

The command gets ``bsmon.probes.launch.child_environment``: every Python process it starts
loads bsmon's agent at start-up, which attaches at the first ``optimizer.step()``
(docs/zero-code.md). Then:

- ``--headless``: a transparent wrapper. The command shares the terminal (its output, Ctrl-C);
  each signal reaches it exactly once (``run_headless``: in the terminal's foreground it shares
  our process group and Ctrl-C comes from the terminal; elsewhere it leads its own group and
  what reaches ``bsmon run`` is passed on). ``bsmon run`` returns the command's exit code
  (128+N for signal N).
- otherwise the dashboard takes the terminal; the command runs in its own session with its
  output in a log file (``--log``, else ``<name>-<pid>.log`` in the bsmon directory, moved
  beside the session's record once the command ends). ``q`` or Ctrl-C stops the command as a
  terminal would (SIGINT to its process group, then SIGTERM, then SIGKILL, each after 10 s or
  at the next Ctrl-C: ``stopping.GroupStop``); ``d`` detaches, leaving it running (``bsmon
  attach NAME`` shows it again) while ``bsmon run`` waits for it. Either way ``bsmon run``
  returns the command's exit code, so ``bsmon run -- python train.py && next_step`` means what
  it says. SIGTERM or SIGINT sent to ``bsmon run`` is passed on to the command's process
  group; a hang-up (the terminal went away) leaves it running. If the command ends before it
  ever served a socket (it crashed at import, or never stepped an optimizer), the dashboard
  closes by itself and the end of its output is printed.
- without a terminal on stdin or stdout (nohup, sbatch, CI, ``> log``) it runs headless, and
  says so in one line.

At the end it prints where the session record is (or why nothing was monitored).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

from bsmon.probes import launch
from bsmon.probes.launch import notes as run_notes
from bsmon.probes.wire import discovery

from ..errors import EXIT_USAGE, CliError
from ..settings import DETACH
from .family import JobFinder
from .records import say_record
from .stopping import GRACE_S, signals_handled, wait_for
from .tidy import tidy

EXIT_NOT_FOUND = 127  # as a shell answers a command it cannot find
EXIT_CANNOT_RUN = 126  # ... and one it found but cannot run
LOG_TAIL_LINES = 5
TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
# The same signal twice within this is one sent twice at once (GNU timeout sends it to bsmon
# run and again to its group): passed on once, as the kernel merges them for a bare job.
SAME_SIGNAL_S = 0.2


def add_parser(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run",
        parents=parents,
        help="run a training command with bsmon attached (no change to the script)",
        description="Run CMD with bsmon's agent loaded at start-up in every Python process it "
        "starts (torchrun's workers too), and open the dashboard on it.",
    )
    p.add_argument("--name", help="the job's name (default: the script's name)")
    p.add_argument("--headless", action="store_true", help="no dashboard: only run the command")
    p.add_argument(
        "--resizable",
        action="store_true",
        help="let + and - change the batch size of the script's training DataLoader (nothing "
        "changes until a key is pressed; docs/zero-code.md lists what is refused and why)",
    )
    p.add_argument(
        "--autopilot",
        action="store_true",
        help="--resizable, and the autopilot on from the start: the batch follows the noise "
        "scale (docs/autopilot.md; a refused autopilot says why in the Events panel)",
    )
    p.add_argument(
        "--log",
        type=Path,
        default=None,
        help="where the command's output goes while the dashboard shows (default: a file in "
        "the bsmon directory, moved beside the session's record when the command ends; its "
        "path is printed at the end)",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=GRACE_S,
        metavar="SECONDS",
        help="when q or Ctrl-C stops the command: the seconds between SIGINT, SIGTERM and "
        f"SIGKILL to its processes (default {GRACE_S:g}; a second Ctrl-C goes on at once)",
    )
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD", help="the command to run")


def exit_status(returncode: int) -> int:
    """A shell's view of a child's status: 128+N for a child killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def parse_command(args: argparse.Namespace) -> list[str]:
    command = list(args.argv)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise CliError("run needs a command, e.g. `bsmon run -- python train.py`", EXIT_USAGE)
    if args.name is not None and not args.name.strip():
        raise CliError("run: --name must not be empty", EXIT_USAGE)
    if shutil.which(command[0]) is None:
        raise CliError(f"run: command not found: {command[0]}", EXIT_NOT_FOUND)
    return command


def no_terminal() -> str | None:
    """Why the dashboard cannot be drawn here (None: stdin and stdout are a terminal)."""
    for label, stream in (("stdout", sys.stdout), ("stdin", sys.stdin)):
        try:
            if not stream.isatty():
                return f"{label} is not a terminal"
        except (AttributeError, ValueError):
            return f"{label} is closed"
    return None


def run(args: argparse.Namespace, readonly: bool) -> int:
    command = parse_command(args)
    name = args.name or launch.job_name(command)
    directory = discovery.ensure_private_dir(discovery.default_dir())
    tidy(directory)  # what killed runs left: their notes, and logs beyond the newest 20
    run_id = f"{os.getpid()}-{secrets.token_hex(4)}"
    env = launch.child_environment(
        os.environ, name, directory, run_id, resizable=args.resizable, autopilot=args.autopilot
    )
    if args.log is not None:
        check_writable(args.log).close()
    headless = args.headless
    if not headless and (why := no_terminal()) is not None:
        print(
            f"bsmon: {why}: running {name} headless (`bsmon attach {name}` shows it)",
            file=sys.stderr,
        )
        headless = True
    try:
        if headless:
            code = run_headless(command, env)
            say_record_or_why(name, run_notes.read(directory, run_id), code)
            return code
        return run_with_dashboard(
            command,
            env,
            name=name,
            directory=directory,
            log_path=args.log,
            readonly=readonly,
            run_id=run_id,
            grace_s=args.grace,
        )
    finally:
        run_notes.clear(directory, run_id)


def start(command: list[str], env: dict[str, str], **options: Any) -> subprocess.Popen:
    try:
        return subprocess.Popen(command, env=env, **options)
    except OSError as exc:
        raise CliError(f"run: cannot run {command[0]}: {exc.strerror}", EXIT_CANNOT_RUN) from None


# -- headless -------------------------------------------------------------------------------


def foreground_group() -> int | None:
    """The process group that Ctrl-C and hang-ups of our controlling terminal reach (None:
    there is no controlling terminal: nohup, sbatch, CI, a daemon)."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return None
    try:
        return os.tcgetpgrp(fd)
    except OSError:
        return None
    finally:
        os.close(fd)


def terminal_signals_reach(pid_group: int) -> bool:
    """Whether Ctrl-C and hang-ups from our terminal reach ``pid_group`` by themselves (it is
    the terminal's foreground process group)."""
    return foreground_group() == pid_group


def own_group_options() -> dict[str, Any]:
    """Popen's arguments that start the child as the leader of a process group of its own."""
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": os.setpgrp}  # pragma: no cover - Python 3.10


def check_writable(log_path: Path) -> BinaryIO:
    """The log opened for appending, or the one-line error (the caller closes it)."""
    try:
        return open(log_path, "ab")
    except OSError as exc:
        message = f"run: cannot write the log {log_path}: {exc.strerror}"
        raise CliError(message, EXIT_USAGE) from None


def say_record_or_why(name: str, notes: list[run_notes.Note], status: int | None) -> None:
    """The last words of a run: where its record is, or why it was not monitored (``status``:
    the command's exit status, None while it runs)."""
    if (why := run_notes.why_unmonitored(notes)) is not None:
        if status == 128 + signal.SIGINT and not any(note.attached for note in notes):
            why = "it was interrupted (Ctrl-C) before bsmon attached at its first optimizer step"
        print(f"bsmon: {name} was not monitored: {why}", file=sys.stderr)
    for record in run_notes.records(notes):
        say_record(name, record)
    for why in run_notes.stopped_recordings(notes):
        print(f"bsmon: {name}: {why}; the job went on unrecorded", file=sys.stderr)


def run_headless(command: list[str], env: dict[str, str]) -> int:
    """Run ``command`` so that every signal reaches it exactly once (docs/zero-code.md,
    "Signals and quitting"). In the terminal's foreground the command stays in our process
    group: Ctrl-C reaches it from the terminal (not passed on), and it may read the terminal.
    Elsewhere (no terminal, a background job) it leads a group of its own, so a signal sent to
    our group (``timeout -s INT``, ``kill -- -PGID``, a batch system) reaches only us, and we
    pass it on once."""
    own_group = not terminal_signals_reach(os.getpgrp())
    process: subprocess.Popen | None = None
    early: list[int] = []  # what came before the command was there to get it
    passed_on: dict[int, float] = {}  # signal -> when it was last passed on

    def forward(signum: int) -> None:
        if process is None:
            early.append(signum)
        elif signum in TERMINAL_SIGNALS and not own_group:
            return  # the terminal sent it to the command too
        elif time.monotonic() - passed_on.get(signum, -SAME_SIGNAL_S) >= SAME_SIGNAL_S:
            passed_on[signum] = time.monotonic()
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signum)

    with signals_handled(forward, (signal.SIGTERM, *TERMINAL_SIGNALS)):
        process = start(command, env, **(own_group_options() if own_group else {}))
        for signum in dict.fromkeys(early):
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signum)
        return exit_status(process.wait())


# -- with the dashboard ---------------------------------------------------------------------


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-lines:]


def run_with_dashboard(
    command: list[str],
    env: dict[str, str],
    *,
    name: str,
    directory: Path,
    log_path: Path | None,
    readonly: bool,
    run_id: str,
    grace_s: float = GRACE_S,
) -> int:
    """``log_path``: where the command's output goes (None: ``default_log``'s, moved beside
    the session's record once the command has ended: ``keep_beside_record``)."""
    from ..app import BsmonApp
    from ..sources import SocketSource

    chosen_log = log_path is not None
    opened = log_path or default_log(directory, name, os.getpid())
    with check_writable(opened) as log:
        process = start(
            command,
            env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    log_path = (
        opened if chosen_log else named_for(opened, default_log(directory, name, process.pid))
    )
    served = threading.Event()
    stopping: list[int] = []
    find = JobFinder(process.pid, name, directory)

    def resolve() -> Path:
        socket = find()
        if socket is not None:
            served.set()
            return socket
        code = process.poll()
        if code is not None:
            if not served.is_set():  # nothing to show: say why, on the terminal
                app.call_from_thread(app.exit)
            raise LookupError(f"{name} exited with code {exit_status(code)}")
        if find.waiting_for_rank0:
            raise LookupError(f"{name}: another rank serves; waiting for rank 0 (it gathers all)")
        notes = run_notes.read(directory, run_id)
        if notes and (why := run_notes.why_unmonitored(notes)) is not None:
            raise LookupError(f"{name} (pid {process.pid}) is running, unmonitored: {why}")
        raise LookupError(
            f"{name} (pid {process.pid}) is running; bsmon attaches at its first optimizer.step()"
        )

    app = BsmonApp(SocketSource(name, resolve), directory=directory, readonly=readonly)

    hung_up: list[int] = []
    closed = threading.Event()

    def close_app() -> None:
        with contextlib.suppress(RuntimeError):  # it closed meanwhile
            app.call_from_thread(app.exit)

    def on_signal(signum: int) -> None:
        if signum == signal.SIGHUP:  # a hang-up ends the monitor, not the training run
            hung_up.append(signum)
        else:
            stopping.append(signum)  # passed on to the job once the dashboard has closed
        if not closed.is_set():
            threading.Thread(target=close_app, daemon=True).start()

    with signals_handled(on_signal, (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)):
        app.run()
        closed.set()
        code = process.poll()
        if code is None and not hung_up:
            first = stopping[0] if stopping else signal.SIGINT  # q or Ctrl-C: as Ctrl-C would
            if not stopping and app.return_value == DETACH:
                first = None
                print(
                    f"bsmon: detached; {name} (pid {process.pid}) goes on, `bsmon attach {name}` "
                    f"shows it again; its output: {log_path}. Waiting for it to end (Ctrl-C "
                    "stops it; closing the terminal leaves it running)",
                    file=sys.stderr,
                )
            code = wait_for(process, name, first=first, grace_s=grace_s)
    status = exit_status(code) if code is not None else None
    notes = run_notes.read(directory, run_id)
    say_record_or_why(name, notes, status)
    if code is not None and not chosen_log:
        log_path = keep_beside_record(log_path, run_notes.records(notes))
    return report_end(name, code, log_path)


def default_log(directory: Path, name: str, pid: int) -> Path:
    return directory / f"{launch.log_name(name)}-{pid}.log"


def named_for(opened: Path, wanted: Path) -> Path:
    """The log renamed for the command's pid (the pid its record and the dashboard show; the
    file had to be open before the command started); where it was if that fails."""
    try:
        os.replace(opened, wanted)
    except OSError:
        return opened
    return wanted


def keep_beside_record(log_path: Path, records: list[str]) -> Path:
    """An ended command's output moves beside its session's record (rank 0's), as
    ``<record>.log``: kept with the record and its summary, not piled up in the socket
    directory, which the system clears at logout or reboot. Where it was when the command was
    not monitored (no record) or the move fails."""
    if not records:
        return log_path
    target = Path(records[0]).with_suffix(".log")
    try:
        shutil.move(log_path, target)
    except OSError:
        with contextlib.suppress(OSError):
            if log_path.exists():
                target.unlink(missing_ok=True)  # a partial copy (a full disk)
        return log_path
    return target


def report_end(name: str, code: int | None, log_path: Path) -> int:
    """What ``bsmon run`` prints when it ends; returns its exit code."""
    if code is None:
        print(f"bsmon: {name} goes on in the background; its output: {log_path}", file=sys.stderr)
        return 0
    status = exit_status(code)
    print(f"bsmon: {name} exited with code {status}; its output: {log_path}", file=sys.stderr)
    if status != 0:
        for line in log_tail(log_path):
            print(f"  | {line}", file=sys.stderr)
    return status
