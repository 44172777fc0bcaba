"""What bsmon costs the training thread of a sharded job, pinned: the Python calls it adds to an
ordinary step of an FSDP2 job (2 real gloo ranks under torchrun, workloads/sharded_job.py's
model), counted with cProfile on each rank's training thread the way tests/unit/test_hot_path.py
counts the unsharded step (benchmarks/hostcost_kit/sharded.py), are the unsharded step's."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ..gpu_check_kit import BENCHMARKS
from ..helpers import ROOT
from .test_noise_sharded import MARK, TORCHRUN, marked  # noqa: F401  (marked: a fixture)

CONFIGS = ("telemetry (noise, anatomy, record off)", "defaults (noise scale on its budget)")
DEADLINE_S = 600  # a safety net: under cProfile an FSDP2 step takes ~10 ms, more when loaded


def sharded_counts(processes, marked: str) -> list[dict]:  # noqa: F811
    """Each rank's counts of ``CONFIGS``, rank 0 first."""
    out = Path(marked, "counts")
    out.mkdir()
    env = {**os.environ, MARK: marked, "PYTHONPATH": f"{BENCHMARKS}{os.pathsep}{ROOT}"}
    words = ("telemetry", "defaults (noise")
    command = [*TORCHRUN, "-m", "hostcost_kit.sharded", "--wrap", "fsdp2", "--out", str(out)]
    command += ["--counts-only", "--counted", "100", "--only", *words]
    proc = processes.python(*command, env=env, text=True, cwd=ROOT)
    try:
        _, err = proc.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the fsdp2 ranks did not count within {DEADLINE_S}s")
    assert proc.returncode == 0, err[-3000:]
    return [json.loads((out / f"rank{rank}.json").read_text())["counts"] for rank in range(2)]


@pytest.mark.slow
def test_an_ordinary_fsdp2_step_costs_what_an_unsharded_one_does(processes, marked):  # noqa: F811
    """A multi-rank job's batch control exchanges at the end of every 8th step: before, it
    asked for the slow path at every step's end (every part asked in turn: 18 calls with
    telemetry, 26 with the defaults, against 4), now only at the exchanges' steps."""
    from hostcost_kit.counting import count_calls
    from hostcost_kit.setups import CONFIGS as SETUPS

    ranks = sharded_counts(processes, marked)
    for name in CONFIGS:
        unsharded = count_calls(SETUPS[name], "tiny", steps=100, warmup=120)
        for counts in ranks:
            sharded = counts[name]
            assert sharded["ordinary"] == unsharded.ordinary, (name, sharded, unsharded)
            assert sharded["bsmon"] == unsharded.bsmon == 1, (name, sharded, unsharded)
            assert sharded["by_category"] == unsharded.by_category, (name, sharded, unsharded)
