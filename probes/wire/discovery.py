"""Where jobs put their sockets, and how a monitor finds them.

Every monitor serves one socket, ``<BSMON_DIR>/<pid>.sock`` (``<pid>-<n>.sock`` for a second
monitor in the same process), beside a small ``.json`` with its name and start time. The
directory is private (0700, owned by the user); anything else is refused with a message that
says what to do.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import socket
import stat
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

ENV_DIR = "BSMON_DIR"
ENV_RECORDS = "BSMON_RECORDS_DIR"
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes on Linux, one of them the terminating NUL


class BsmonDirError(RuntimeError):
    """The socket directory cannot be used safely; the message says why and what to do."""


def default_dir() -> Path:
    """``$BSMON_DIR``, else ``$XDG_RUNTIME_DIR/bsmon``, else ``/tmp/bsmon-$UID``."""
    if explicit := os.environ.get(ENV_DIR):
        return Path(explicit).expanduser()
    if runtime := os.environ.get("XDG_RUNTIME_DIR"):
        return Path(runtime) / "bsmon"
    return Path(tempfile.gettempdir()) / f"bsmon-{os.getuid()}"


def records_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where session records are kept: ``$BSMON_RECORDS_DIR`` (what ``bsmon run`` hands its
    job: the directory of the shell that ran it, since the job's ``BSMON_DIR`` is pointed at
    the socket directory), else ``$BSMON_DIR/records``, else ``$XDG_DATA_HOME/bsmon/records``
    (``~/.local/share/bsmon/records``) — a data directory that survives logout and reboot,
    unlike the socket directory (``$XDG_RUNTIME_DIR`` is a tmpfs the system may clear at
    logout; ``/tmp`` is cleared at reboot). ``environ``: read these from it, not the
    process's own environment."""
    env = os.environ if environ is None else environ
    if records := env.get(ENV_RECORDS):
        return Path(records).expanduser()
    if explicit := env.get(ENV_DIR):
        return Path(explicit).expanduser() / "records"
    home = env.get("HOME") or str(Path.home())
    data = env.get("XDG_DATA_HOME") or str(Path(home) / ".local" / "share")
    return Path(data).expanduser() / "bsmon" / "records"


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` as a 0700 directory, or check that an existing one is safe to use.
    Missing parents are made 0700 too, whatever the umask: under umask 000, ``~/.local/share``
    made world-writable would let another user swap the directories below it."""
    try:
        _make_private_dirs(path)
    except OSError as exc:
        raise BsmonDirError(f"cannot create bsmon directory {path}: {exc.strerror}") from None
    check_private_dir(path)
    return path


def _make_private_dirs(path: Path) -> None:
    missing = []
    while not os.path.lexists(path) and path != path.parent:
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile: checked like any other
            os.mkdir(directory, 0o700)
            os.chmod(directory, 0o700)  # the umask took bits away; it may have taken ours


def check_private_dir(path: Path) -> None:
    """Refuse a symlink, a non-directory, or a directory owned by someone else; fix loose modes."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise BsmonDirError(
            f"bsmon directory {path} is a symbolic link; refusing to use it "
            f"(set {ENV_DIR} to a real directory you own)"
        )
    if not stat.S_ISDIR(info.st_mode):
        raise BsmonDirError(f"bsmon directory {path} exists but is not a directory")
    if info.st_uid != os.getuid():
        raise BsmonDirError(
            f"bsmon directory {path} belongs to uid {info.st_uid}, not to you (uid {os.getuid()}); "
            f"refusing to use it (set {ENV_DIR} to a directory you own)"
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, 0o700)


def socket_path(directory: Path, pid: int, serial: int = 0) -> Path:
    """``<pid>.sock`` for a process's first monitor, ``<pid>-<n>.sock`` for later ones."""
    path = directory / (f"{pid}.sock" if serial == 0 else f"{pid}-{serial}.sock")
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise BsmonDirError(
            f"socket path {path} is longer than {MAX_SOCKET_PATH} bytes, the limit for Unix "
            f"sockets; set {ENV_DIR} to a shorter directory"
        )
    return path


def free_socket_path(directory: Path, pid: int) -> Path:
    """The first socket path of this process that no live monitor of it is using."""
    for serial in range(1000):
        path = socket_path(directory, pid, serial)
        if not path.exists():
            return path
    raise BsmonDirError(f"too many bsmon sockets for pid {pid} in {directory}")


def _socket_order(path: Path) -> tuple[int, int, str]:
    pid, _, serial = path.stem.partition("-")
    return (int(pid) if pid.isdigit() else -1, int(serial) if serial.isdigit() else 0, path.name)


def pid_of_socket(path: Path) -> int | None:
    try:
        return int(path.stem.split("-", 1)[0])
    except ValueError:
        return None


TEMP_NAME_TRIES = 16


def create_temp_beside(path: Path, mode: int = 0o600) -> tuple[int, Path]:
    """A new file beside ``path``, open for writing, under a name nobody can guess: created
    with ``O_EXCL|O_NOFOLLOW``, so a file or link planted there is never opened, let alone
    written through. ``os.replace`` of it onto ``path`` then replaces a link at ``path``
    itself, never its target."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    for _ in range(TEMP_NAME_TRIES):
        temp = path.with_name(f".{path.name}.{_temp_token()}.tmp")
        with contextlib.suppress(FileExistsError):
            return os.open(temp, flags, mode), temp
    raise FileExistsError(
        errno.EEXIST, f"{TEMP_NAME_TRIES} temporary names beside {path.name} were all taken"
    )


def _temp_token() -> str:
    return secrets.token_hex(8)


def replace_atomically(path: Path, data: bytes, mode: int = 0o600) -> None:
    """``path`` holds ``data`` (whole, or as it was) through a new temporary file beside it."""
    fd, temp = create_temp_beside(path, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def metadata_path(socket_file: Path) -> Path:
    return socket_file.with_suffix(".json")


def write_metadata(socket_file: Path, info: dict[str, object]) -> None:
    """Write the job's listing info atomically beside its socket (0600)."""
    replace_atomically(metadata_path(socket_file), json.dumps(info).encode())


def remove_job_files(socket_file: Path) -> None:
    for path in (socket_file, metadata_path(socket_file)):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


@dataclass(frozen=True)
class JobEntry:
    """A live job's socket, as found in the directory (before connecting to it)."""

    socket: Path
    pid: int
    name: str
    host: str
    start_time: float | None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(os.fspath(path))
        except OSError as exc:
            return exc.errno not in (errno.ECONNREFUSED, errno.ENOENT)
    return True


def _read_metadata(socket_file: Path) -> dict[str, object]:
    try:
        data = json.loads(metadata_path(socket_file).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def iter_jobs(directory: Path | None = None, *, clean_stale: bool = True) -> Iterator[JobEntry]:
    """Jobs whose sockets are in ``directory``; sockets of dead processes are removed."""
    directory = directory or default_dir()
    if not directory.is_dir():
        return
    check_private_dir(directory)
    for sock in sorted(directory.glob("*.sock"), key=_socket_order):
        pid = pid_of_socket(sock)
        if pid is None:
            continue
        if not pid_alive(pid) or not _listening(sock):
            if clean_stale:
                remove_job_files(sock)
            continue
        meta = _read_metadata(sock)
        start = meta.get("start_time")
        yield JobEntry(
            socket=sock,
            pid=pid,
            name=str(meta.get("name") or f"pid{pid}"),
            host=str(meta.get("host") or socket.gethostname()),
            start_time=float(start) if isinstance(start, (int, float)) else None,
        )


def resolve_target(target: str, directory: Path | None = None) -> Path:
    """A socket path for NAME, PID or SOCKET; raises LookupError with what was found instead."""
    as_path = Path(target).expanduser()
    if target.endswith(".sock") or os.sep in target:
        if as_path.exists():
            return as_path
        raise LookupError(f"no socket at {as_path}")
    jobs = list(iter_jobs(directory))
    if target.isdigit():
        matches = [job for job in jobs if job.pid == int(target)]
    else:
        matches = [job for job in jobs if job.name == target]
    if len(matches) == 1:
        return matches[0].socket
    if not matches:
        known = ", ".join(f"{job.name} (pid {job.pid})" for job in jobs) or "none"
        wanted = f"with pid {target}" if target.isdigit() else f"named {target!r}"
        raise LookupError(f"no running job {wanted}; running jobs: {known}")
    pids = ", ".join(str(job.pid) for job in matches)
    raise LookupError(f"several jobs are named {target!r} (pids {pids}); attach by pid")
