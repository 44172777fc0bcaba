"""Every example runs as it stands, with a small step count (all started at once, to keep the
suite short on two cores; each is checked on its own)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..helpers import ROOT, Processes
from ..watch import kill_run_processes

EXAMPLES = ROOT / "examples"
BSMON_RUN = [sys.executable, "-m", "bsmon.tui.cli", "run", "--headless", "--"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
RUNS = {
    "plain_loop": ([sys.executable, "plain_loop.py", "--steps", "30"], "plain-loop: 30 steps"),
    "unmodified": ([*BSMON_RUN, sys.executable, "unmodified.py", "--epochs", "1"], "epoch 0:"),
    "ddp_torchrun": ([*BSMON_RUN, *TORCHRUN, "ddp_torchrun.py", "--steps", "20"], "ddp: 20 steps"),
    "lightning_callback": (
        [sys.executable, "lightning_callback.py", "--steps", "20"],
        "lightning-example: 20 steps",
    ),
    "hf_trainer": ([sys.executable, "hf_trainer.py", "--steps", "10"], "hf-example: 10 steps"),
}


@pytest.fixture(scope="module")
def example_runs() -> Iterator[dict[str, subprocess.Popen]]:
    directory = tempfile.mkdtemp(prefix="bsm-ex-", dir="/tmp")
    os.chmod(directory, 0o700)
    env = {**os.environ, "BSMON_DIR": directory}
    processes = Processes()
    try:
        yield {
            name: processes.start(command, cwd=EXAMPLES, env=env, text=True)
            for name, (command, _) in RUNS.items()
        }
    finally:
        kill_run_processes(Path(directory))
        processes.cleanup()
        shutil.rmtree(directory, ignore_errors=True)


def test_every_example_is_named_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    scripts = sorted(path.stem for path in EXAMPLES.glob("*.py"))
    assert scripts == sorted(RUNS)
    for script in scripts:
        assert f"examples/{script}.py" in readme


@pytest.mark.parametrize("name", sorted(RUNS))
def test_example_runs(example_runs, name):
    process = example_runs[name]
    out, err = process.communicate(timeout=280)
    assert process.returncode == 0, f"{name} failed:\n{out}\n{err}"
    assert RUNS[name][1] in out
    assert "Traceback" not in err
