"""``bsmon demo``: start the demo training job in a subprocess and open the dashboard on it.

The job runs in its own process group with its output in a log file beside its socket;
quitting the dashboard stops it (SIGTERM, then SIGKILL after a grace period).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from bsmon.probes.wire import discovery

from .records import say_record_of
from .run import no_terminal
from .tidy import tidy

STOP_GRACE_S = 10.0


def job_arguments(args: argparse.Namespace) -> list[str]:
    """The demo job's own command-line arguments, from ``bsmon demo``'s."""
    job_args = ["--name", args.name, "--batch-size", str(args.batch_size), "--device", args.device]
    if args.steps:
        job_args += ["--steps", str(args.steps)]
    if args.model != "cnn":
        job_args += ["--model", args.model]
    return job_args


def stop_job(process: subprocess.Popen) -> int:
    """Stop the demo job and its process group; returns its exit code."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return process.returncode


def run_demo(args: argparse.Namespace) -> int:
    headless = args.headless
    if not headless and (why := no_terminal()) is not None:
        print(f"bsmon: {why}: running the demo headless", file=sys.stderr)
        headless = True
    if headless:
        from bsmon.probes.demo import main as job_main

        try:
            return job_main(job_arguments(args))
        finally:
            say_record_of(args.name, os.getpid())

    from ..app import BsmonApp
    from ..sources import SocketSource

    directory = discovery.ensure_private_dir(discovery.default_dir())
    tidy(directory)
    log_path = directory / f"demo-{os.getpid()}.log"
    with open(log_path, "wb") as log:
        command = [sys.executable, "-m", "bsmon.probes.demo", *job_arguments(args)]
        process = subprocess.Popen(
            [*command, "--exit-with-parent"],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    socket = discovery.socket_path(directory, process.pid)

    def resolve() -> Path:
        code = process.poll()
        if code is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
            raise LookupError(f"the demo job exited with code {code}: {' | '.join(tail)}")
        if not socket.exists():
            raise LookupError("the demo job is starting (importing torch, building the model)")
        return socket

    try:
        BsmonApp(
            SocketSource(args.name, resolve), directory=directory, readonly=args.readonly
        ).run()
    finally:
        code = stop_job(process)
    say_record_of(args.name, process.pid)
    if code not in (0, -signal.SIGTERM, -signal.SIGKILL):
        print(f"bsmon: the demo job exited with code {code}; its log: {log_path}", file=sys.stderr)
        return 1
    with contextlib.suppress(OSError):
        log_path.unlink()
    return 0
