"""Close the monitors (end line, summary) when the job is stopped with SIGTERM.

The handler is installed only where SIGTERM still has its default action (a job with a
handler of its own keeps it, and ``close`` runs from ``atexit`` when that handler exits), and
only from the main thread. After closing, it restores the default action and sends SIGTERM
again, so the process ends exactly as it would have: killed by SIGTERM, exit status 143.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

_state: dict[str, Callable[[], Iterable[Any]]] = {"monitors": list}
REASON = "terminated (SIGTERM)"


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _handler(signum: int, _frame: FrameType | None) -> None:
    try:
        for monitor in list(_state["monitors"]()):
            with contextlib.suppress(Exception):
                monitor.close(REASON)
    finally:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def install(monitors: Callable[[], Iterable[Any]]) -> bool:
    """Install the handler if SIGTERM has its default action; True when ours is in place."""
    if not _on_main_thread():
        return False
    try:
        current = signal.getsignal(signal.SIGTERM)
        if current is _handler:
            return True
        if current != signal.SIG_DFL:
            return False
        _state["monitors"] = monitors
        signal.signal(signal.SIGTERM, _handler)
    except (ValueError, OSError):
        return False
    return True


def uninstall_if_idle() -> None:
    """Give SIGTERM back its default action once no monitor is left (main thread only)."""
    if not _on_main_thread() or any(True for _ in _state["monitors"]()):
        return
    with contextlib.suppress(ValueError, OSError):
        if signal.getsignal(signal.SIGTERM) is _handler:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def installed() -> bool:
    return signal.getsignal(signal.SIGTERM) is _handler
