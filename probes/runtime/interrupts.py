"""Ctrl-C in a job with bsmon attached: the traceback ends at the user's line, as without it.

bsmon wraps a few torch calls once per process (``call_watch``, the shared backward, the
DataLoader's iterator); a KeyboardInterrupt that arrives while one of them runs would list
bsmon's frames, as if bsmon had failed. ``install`` puts a filter in front of
``sys.excepthook`` once per process: for a KeyboardInterrupt only, the frames of bsmon's own
files are left out of the traceback it prints; every other exception reaches the previous hook
untouched, and the exit status (killed by SIGINT) does not change. The hook also notes the
exception's type, so the record ends with how the job ended ("interrupted: KeyboardInterrupt",
"the job raised ValueError") rather than "the job exited".
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

PROBES_DIR = str(Path(__file__).resolve().parent.parent) + os.sep  # bsmon.probes' files
_installed: list[bool] = []
_uncaught: list[type[BaseException]] = []  # what ended the job, as the hook saw it
EXITED = "the job exited"
INTERRUPTED = "interrupted: KeyboardInterrupt (Ctrl-C)"


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
        _uncaught.append(kind)
        if issubclass(kind, KeyboardInterrupt):
            try:
                tb = without_bsmon(tb)
                value = value.with_traceback(tb)
            except Exception:  # the whole traceback is better than none
                pass
        previous(kind, value, tb)

    sys.excepthook = hook
