"""Where the job's monitor is reached and kept: the socket (its path, its metadata file, a
socket that could not be served) and the session record."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..record.recorder import HasReading, Recorder
from ..record.writer import RECORDS_SUBDIR, claim_record_path, default_record_path
from ..runtime import audience
from ..runtime.session import SessionInfo
from ..runtime.telemetry import Telemetry
from ..summary import build as summary_build
from ..wire import discovery
from ..wire.protocol import Capability, Event

if TYPE_CHECKING:
    from .monitor import Monitor


def say_recording_stopped(message: str) -> None:
    """One line where a headless user looks, beside the event on the socket: a RuntimeWarning,
    as bsmon says it serves no socket. Under ``bsmon run`` the job's output stays the job's:
    ``bsmon run`` says it after the job, from the process's note (``launch.notes``)."""
    if audience.zero_code():
        return
    with contextlib.suppress(Exception):  # under -W error it would raise in the writer's thread
        # explicit: no stack (another thread's) to point at, so the line stands alone
        warnings.warn_explicit(f"{message}; the job goes on unrecorded", RuntimeWarning, "bsmon", 0)


def make_recorder(
    record: bool | str | os.PathLike[str],
    socket_dir: str | os.PathLike[str] | None,
    *,
    session: SessionInfo,
    telemetry: Telemetry,
    emit: Callable[[Event], None],
    noise: HasReading,
    name: str,
    pid: int,
) -> Recorder | None:
    """The session recorder (``record=True``: in ``discovery.records_dir()``, or beside
    the socket when ``socket_dir`` is given; a path: there)."""
    if record is False:
        return None
    private_dir = None
    if record is True:
        records = (
            Path(socket_dir).expanduser() / RECORDS_SUBDIR
            if socket_dir is not None
            else discovery.records_dir()
        )
        path = default_record_path(records, name, session.start_time, pid)
        private_dir = path.parent
    elif isinstance(record, (str, os.PathLike)) and os.fspath(record):
        path = Path(record).expanduser().absolute()
    else:
        raise TypeError(f"record must be True, False or a path, got {record!r}")
    path = claim_record_path(path)
    session.record = str(path)
    return Recorder(
        path,
        session,
        telemetry,
        emit,
        private_dir=private_dir,
        noise=noise,
        before=summary_build.preload,
        on_stopped=say_recording_stopped,
    )


def prepare_socket(mon: Monitor, socket_dir: str | os.PathLike[str] | None) -> Path | None:
    try:
        directory = discovery.ensure_private_dir(
            Path(socket_dir).expanduser() if socket_dir is not None else discovery.default_dir()
        )
        path = discovery.free_socket_path(directory, mon._pid)
    except (discovery.BsmonDirError, OSError) as exc:
        degrade(mon, str(exc))
        return None
    return path


def start_service(mon: Monitor) -> None:
    try:
        mon._service.start_and_wait()
    except Exception as exc:
        degrade(mon, f"could not serve {mon.socket_path}: {exc}")
        mon.socket_path = None
        return
    if mon.socket_path is not None:
        mon.job.serving = Capability(True)
        write_metadata(mon)


def write_metadata(mon: Monitor) -> None:
    assert mon.socket_path is not None
    discovery.write_metadata(
        mon.socket_path,
        {
            "name": mon.job.name,
            "pid": mon._pid,
            "host": mon.session.host,
            "start_time": mon.session.start_time,
        },
    )


def socket_rebound(mon: Monitor) -> None:
    """The agent thread made the socket again after someone deleted it."""
    with contextlib.suppress(OSError):
        write_metadata(mon)
    mon._ctx.warn(
        "socket_rebound", f"the socket {mon.socket_path} was deleted; bsmon made it again"
    )


def degrade(mon: Monitor, reason: str) -> None:
    mon.job.serving = Capability(False, reason)
    warnings.warn(
        f"bsmon: not serving a socket, the job goes on unmonitored: {reason}",
        RuntimeWarning,
        stacklevel=5,  # attach's frame: degrade ← caller ← assemble ← Monitor ← attach
    )
