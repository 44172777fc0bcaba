"""Security: nothing on the socket path unpickles, a pickle sent to it is just bad input, and the
probe's recipe (the only pickle bsmon writes) is a private file that is removed.

A peer of another uid, the socket and directory modes, and an unsafe BSMON_DIR are proved in
test_server.py, test_discovery.py and test_cli.py (see docs/reliability.md)."""

from __future__ import annotations

import ast
import os
import pickle
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bsmon.probes import attach
from bsmon.probes.maxbatch import recipe as recipes
from bsmon.probes.wire import protocol
from bsmon.probes.wire.client import JobConnection

from ..helpers import ROOT
from ..jobs import TinyJob

# Everything that reads bytes from a socket or a record: every module of bsmon but the
# max-batch probe's (the sidecar reads the recipe, a private file the job wrote, never the
# socket).
SOCKET_PATH_MODULES = [
    path
    for path in sorted([*(ROOT / "probes").rglob("*.py"), *(ROOT / "tui").rglob("*.py")])
    if "maxbatch" not in path.parts
]
UNPICKLERS = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve", "joblib"}


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
        elif (
            isinstance(node, ast.Attribute)
            and node.attr in ("load", "loads")
            and isinstance(node.value, ast.Name)
            and node.value.id == "torch"
        ):
            names.add("torch.load")
    return names


def test_no_module_on_the_socket_or_record_path_can_unpickle():
    assert len(SOCKET_PATH_MODULES) > 40
    offenders = {
        path.relative_to(ROOT).as_posix(): sorted(found)
        for path in SOCKET_PATH_MODULES
        if (found := imported_modules(path) & (UNPICKLERS | {"torch.load"}))
    }
    assert offenders == {}


def test_a_pickle_sent_to_the_socket_is_refused_as_not_json(bsmon_dir, tmp_path):
    job = TinyJob()
    canary = tmp_path / "unpickled"

    class Exploit:
        def __reduce__(self):
            return (canary.touch, ())

    payload = pickle.dumps(Exploit(), protocol=0).replace(b"\n", b" ")
    mon = attach(job.model, job.optimizer, batch_size=8, record=False)
    with mon, JobConnection(mon.socket_path) as conn:
        conn.hello()
        conn.send_raw(payload + b"\n")
        reply = conn.wait_for(protocol.Reply)
        assert not reply.ok and "not valid JSON" in reply.error
    assert not canary.exists()


def test_the_probe_recipe_is_a_private_file_in_the_private_directory(bsmon_dir):
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    cls, kwargs, groups = recipes.optimizer_spec(optimizer, model)
    recipe = recipes.Recipe(
        model=recipes.pickle_structure(model),
        optimizer_class=cls,
        optimizer_kwargs=kwargs,
        param_groups=groups,
        batch=(torch.zeros(2, 4), torch.zeros(2, 1)),
        batch_size=2,
        device="cpu",
        job_batch_size=2,
    )
    path = recipes.write(recipe, bsmon_dir)
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    finally:
        path.unlink()


def test_the_unpickler_check_would_see_one():
    assert "cloudpickle" in imported_modules(ROOT / "probes" / "maxbatch" / "recipe.py")


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to make a directory another uid owns")
def test_a_bsmon_dir_owned_by_someone_else_is_refused_by_the_command_line(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    result = subprocess.run(
        [sys.executable, "-m", "bsmon.tui.cli", "list"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "BSMON_DIR": str(theirs)},
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "belongs to uid 65534, not to you" in result.stderr
    assert "set BSMON_DIR to a directory you own" in result.stderr
