"""What `bsmon run` gives its command: the environment it would have without bsmon, plus
bsmon's variables. A script that runs bare runs the same under `bsmon run`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bsmon.probes.launch import environment as launch

from ..watch import kill_run_processes

BOOT = str(launch.BOOT_DIR)


@pytest.mark.parametrize(
    ("given", "entries"),
    [
        (":/x", [BOOT, "", "/x"]),  # the shell's $PYTHONPATH:/x when it was empty
        ("/x::/y", [BOOT, "/x", "", "/y"]),
        (f"{BOOT}:/x:", [BOOT, "/x", ""]),  # bsmon run inside bsmon run: its hook once
        ("", [BOOT]),
        (None, [BOOT]),
    ],
)
def test_the_child_keeps_the_empty_entries_of_a_python_path_that_was_set(tmp_path, given, entries):
    base = {"HOME": "/h"} if given is None else {"HOME": "/h", "PYTHONPATH": given}
    env = launch.child_environment(base, "n", tmp_path, "r")
    assert env["PYTHONPATH"].split(os.pathsep) == entries


PACKAGE_SCRIPT = """
import mypkg
import torch

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.randn(8, 4)).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
print("trained with", mypkg.NAME)
"""


def test_a_script_importing_from_its_working_directory_runs_under_bsmon_run(bsmon_dir, tmp_path):
    """`PYTHONPATH=:/x python scripts/train.py` imports mypkg from the working directory; under
    `bsmon run --headless` it died with ModuleNotFoundError (the empty entry was dropped)."""
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("NAME = 'mypkg'\n")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "train.py").write_text(PACKAGE_SCRIPT)
    env = {**os.environ, "PYTHONPATH": f":{tmp_path / 'elsewhere'}"}
    script = [sys.executable, "scripts/train.py"]
    bsmon = [sys.executable, "-m", "bsmon.tui.cli", "run", "--headless", "--name", "cwd", "--"]
    try:
        bare = subprocess.run(script, cwd=tmp_path, env=env, capture_output=True, text=True)
        watched = subprocess.run(
            [*bsmon, *script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
    finally:
        kill_run_processes(bsmon_dir)
    assert bare.returncode == 0 and bare.stdout == "trained with mypkg\n"
    assert watched.returncode == 0, watched.stderr
    assert watched.stdout.splitlines()[0] == "trained with mypkg"
    assert "ModuleNotFoundError" not in watched.stderr and "not monitored" not in watched.stderr
