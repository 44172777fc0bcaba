"""The socket directory: private, refused when unsafe, stale sockets cleaned."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys

import pytest

from bsmon.probes.wire import discovery

needs_root = pytest.mark.skipif(os.getuid() != 0, reason="needs root to chown to another uid")


def test_default_dir_order(monkeypatch, tmp_path):
    monkeypatch.setenv("BSMON_DIR", str(tmp_path / "x"))
    assert discovery.default_dir() == tmp_path / "x"
    monkeypatch.delenv("BSMON_DIR")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert discovery.default_dir() == tmp_path / "bsmon"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert discovery.default_dir().name == f"bsmon-{os.getuid()}"


def test_directory_is_created_0700_and_loose_modes_are_tightened(tmp_path):
    path = discovery.ensure_private_dir(tmp_path / "a" / "b")
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    os.chmod(path, 0o755)
    discovery.ensure_private_dir(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o700


def test_symlinked_directory_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(discovery.BsmonDirError, match="symbolic link"):
        discovery.ensure_private_dir(link)


def test_a_file_in_place_of_the_directory_is_refused(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(discovery.BsmonDirError):
        discovery.ensure_private_dir(path)


@needs_root
def test_directory_owned_by_someone_else_is_refused(tmp_path):
    path = tmp_path / "theirs"
    path.mkdir(mode=0o700)
    os.chown(path, 65534, 65534)
    with pytest.raises(discovery.BsmonDirError, match="belongs to uid 65534"):
        discovery.ensure_private_dir(path)


def test_socket_path_that_is_too_long_says_what_to_do(tmp_path):
    deep = tmp_path / ("d" * 120)
    with pytest.raises(discovery.BsmonDirError, match="shorter directory"):
        discovery.socket_path(deep, 1234)


def test_stale_sockets_are_removed_and_live_ones_listed(bsmon_dir):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead_pid = int(dead.stdout)
    stale = bsmon_dir / f"{dead_pid}.sock"
    stale.touch()
    discovery.write_metadata(stale, {"name": "ghost"})
    live_path = discovery.socket_path(bsmon_dir, os.getpid())
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(live_path))
    server.listen(1)
    discovery.write_metadata(live_path, {"name": "me", "host": "h", "start_time": 5.0})
    try:
        jobs = list(discovery.iter_jobs(bsmon_dir))
    finally:
        server.close()
    assert [(j.name, j.pid, j.start_time) for j in jobs] == [("me", os.getpid(), 5.0)]
    assert not stale.exists() and not discovery.metadata_path(stale).exists()


def test_resolve_target_by_name_pid_and_path(bsmon_dir):
    path = discovery.socket_path(bsmon_dir, os.getpid())
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)
    discovery.write_metadata(path, {"name": "trainer"})
    try:
        assert discovery.resolve_target("trainer") == path
        assert discovery.resolve_target(str(os.getpid())) == path
        assert discovery.resolve_target(str(path)) == path
        with pytest.raises(
            LookupError, match="no running job named 'other'; running jobs: trainer"
        ):
            discovery.resolve_target("other")
        with pytest.raises(LookupError, match="no running job with pid 99999999; running"):
            discovery.resolve_target("99999999")  # a pid is not a name
        with pytest.raises(LookupError, match="no socket at"):
            discovery.resolve_target(str(bsmon_dir / "nope.sock"))
    finally:
        server.close()
