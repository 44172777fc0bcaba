"""Ctrl-C in a job with bsmon attached: the traceback ends at the user's line, as without it.

bsmon wraps a few torch calls once per process (``call_watch``, the shared backward, the
DataLoader's iterator); a KeyboardInterrupt that arrives while one of them runs would list
bsmon's frames, as if bsmon had failed. ``install`` puts a filter in front of
``sys.excepthook`` once per process: for a KeyboardInterrupt only, the frames of bsmon's own
files are left out of the traceback it prints; every other exception reaches the previous hook
untouched, and the exit status (killed by SIGINT) does not change. The hook also notes the
exception's type, so the record ends with how the job ended ("interrupted: KeyboardInterrupt",
"the job raised ValueError") rather than "the job exited".

A second Ctrl-C is ordinary: it may land while the hook runs or while the monitor closes at
exit. ``signals_deferred`` holds SIGINT, SIGTERM and SIGHUP back in those two places and
gives each one that came to the job's handler (or Python's) once they are done, so bsmon's
exit path is not cut short and no traceback of bsmon's frames is ever printed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

PROBES_DIR = str(Path(__file__).resolve().parent.parent) + os.sep  # bsmon.probes' files
_installed: list[bool] = []
_uncaught: list[type[BaseException]] = []  # what ended the job, as the hook saw it
EXITED = "the job exited"
INTERRUPTED = "interrupted: KeyboardInterrupt (Ctrl-C)"
DEFERRED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def ending(kind: type[BaseException] | None) -> str:
    """How a job that ends with the exception ``kind`` (None: none) ended, in the record's
    words."""
    if kind is None or issubclass(kind, SystemExit):
        return EXITED
    if issubclass(kind, KeyboardInterrupt):
        return INTERRUPTED
    return f"the job raised {kind.__name__}"


def exit_reason() -> str:
    """At exit: how the job ended, from the uncaught exception the hook saw (if any)."""
    return ending(_uncaught[-1] if _uncaught else None)


def without_bsmon(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` without the frames of bsmon.probes' files (the rest in their order)."""
    kept = []
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(PROBES_DIR):
            kept.append(tb)
        tb = tb.tb_next
    chain = None
    for entry in reversed(kept):
        chain = types.TracebackType(chain, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return chain


def install() -> None:
    """Once per process; never raises."""
    if _installed:
        return
    _installed.append(True)
    previous = sys.excepthook

    def hook(
        kind: type[BaseException], value: BaseException, tb: types.TracebackType | None
    ) -> None:
        with signals_deferred():
            _uncaught.append(kind)
            if issubclass(kind, KeyboardInterrupt):
                try:
                    tb = without_bsmon(tb)
                    value = value.with_traceback(tb)
                except Exception:  # the whole traceback is better than none
                    pass
            previous(kind, value, tb)

    sys.excepthook = hook


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Inside the block, SIGINT, SIGTERM and SIGHUP that have a Python handler are only noted;
    after it, each noted one goes to that handler, and whatever the handler raises is dropped
    (at exit, where this is used, Python would only print it, blaming bsmon). A signal whose
    action is the default or ignore is left alone. Off the main thread, nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[tuple[int, FrameType | None]] = []
    handlers = _hold(DEFERRED, lambda signum, frame: noted.append((signum, frame)))
    try:
        yield
    finally:
        for signum, handler in handlers.items():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(signum, handler)
        for signum, frame in noted:
            with contextlib.suppress(BaseException):
                handlers[signum](signum, frame)


def _hold(signums: tuple[int, ...], note: Any) -> dict[int, Any]:
    """Put ``note`` in place of each of ``signums``' Python handlers; the handlers replaced."""
    replaced = {}
    for signum in signums:
        with contextlib.suppress(ValueError, OSError, TypeError):
            handler = signal.getsignal(signum)
            if callable(handler):
                signal.signal(signum, note)
                replaced[signum] = handler
    return replaced
