"""Shared fixtures: a private BSMON_DIR and child processes cleaned up at teardown."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import Processes


@pytest.fixture(autouse=True)
def private_data_home(monkeypatch: pytest.MonkeyPatch, tmp_path_factory) -> None:
    """Records of tests that set no BSMON_DIR go to a temporary XDG data home, never ~."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.getbasetemp() / "data-home"))


@pytest.fixture
def bsmon_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A short private directory for sockets (Unix socket paths are limited to 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="bsm-", dir="/tmp"))
    os.chmod(path, 0o700)
    monkeypatch.setenv("BSMON_DIR", str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def processes() -> Iterator[Processes]:
    procs = Processes()
    try:
        yield procs
    finally:
        procs.cleanup()
