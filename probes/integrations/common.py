"""What ``bsmon run`` and the framework integrations share."""

from __future__ import annotations

import functools
import importlib
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ..wire.protocol import Event

BATCH_COMMANDS = ("set_batch_size", "step_batch_size", "autopilot")


def require(module: str, extra: str, framework: str) -> ModuleType:
    """Import ``module`` or raise an ImportError that says which extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"bsmon.probes.integrations.{extra} needs {framework}, which this Python cannot "
            f"import ({exc}); install it with: pip install 'bsmon[{extra}]'"
        ) from None


def rank_name(base: str, rank: int, world_size: int) -> str:
    """Rank 0 keeps the job's name (``bsmon attach NAME`` finds it); the others get a suffix."""
    return base if world_size <= 1 or rank == 0 else f"{base}-rank{rank}"


def disable_batch_control(monitor: Any, reason: str) -> None:
    """Make the batch commands answer ``ok: false`` with ``reason`` (also in hello)."""
    for kind in BATCH_COMMANDS:
        monitor.job.disable(kind, reason)


def guarded(hook: Callable[..., None]) -> Callable[..., None]:
    """For a callback hook that runs on the training thread: an exception inside it is
    counted and shown by the callback's monitor (``self.monitor``), never raised into the job."""

    @functools.wraps(hook)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            hook(self, *args, **kwargs)
        except Exception as exc:
            monitor = getattr(self, "monitor", None)
            if monitor is not None:
                monitor.job.report_error(f"{type(self).__name__}.{hook.__name__}", exc)

    return wrapper


def note(monitor: Any, kind: str, message: str, **data: Any) -> None:
    """An event in the job's log, stamped with the monitor's current step (a warning is
    ``monitor.job.ctx.warn``)."""
    monitor.job.emit(Event(t=time.time(), step=monitor.step, kind=kind, message=message, data=data))
