"""A job that counts the signals it gets: each SIGINT, SIGTERM or SIGHUP appends its name to
the file ``argv[1]``. Once its handlers are in it writes "ready PPID" there and "ready" on
stdout; it ends (exit 0) when its stdin closes."""

import os
import signal
import sys

PATH = sys.argv[1]


def note(line: str) -> None:
    with open(PATH, "a") as f:
        f.write(line + "\n")


def count(signum: int, _frame: object) -> None:
    note(signal.Signals(signum).name)


for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(signum, count)
note(f"ready {os.getppid()}")
print("ready", flush=True)
sys.stdin.read()
