"""What bsmon costs the training thread of a sharded job, pinned: the Python calls it adds to an
ordinary step of an FSDP2 or a DDP job (2 real gloo ranks under torchrun, workloads/sharded_job.py's
model), counted with cProfile on each rank's training thread the way tests/unit/test_hot_path.py
counts the unsharded step (benchmarks/hostcost_kit/sharded.py), are the unsharded step's, and
under DDP with the noise scale on, its communication hook's on each bucket."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ..gpu_check_kit import BENCHMARKS
from ..helpers import ROOT
from .test_noise_sharded import MARK, TORCHRUN, marked  # noqa: F401  (marked: a fixture)

TELEMETRY = "telemetry (noise, anatomy, record off)"
DEFAULTS = "defaults (noise scale on its budget)"
DEADLINE_S = 600  # a safety net: under cProfile an FSDP2 step takes ~10 ms, more when loaded
# DDP's comm hook runs on every step (DDP cannot remove one); on a step the noise scale does
# not measure, bsmon's hook all-reduces the bucket and returns: its own call, and the bucket's
# buffer, div_, allreduce, get_future and then (sharded_job.py's model fills one bucket)
COMM_HOOK = {"bsmon": 1, "C": 5}
# what an ordinary step of each wrap adds to the unsharded one's, by category
ADDED = {
    ("fsdp2", TELEMETRY): {},
    ("fsdp2", DEFAULTS): {},
    ("ddp", TELEMETRY): {},
    ("ddp", DEFAULTS): COMM_HOOK,  # was 84 (bsmon 48): every step took the slow path, too
}


def sharded_counts(processes, marked: str, wrap: str) -> list[dict]:  # noqa: F811
    """Each rank's counts of the telemetry and the defaults under ``wrap``, rank 0 first."""
    out = Path(marked, "counts")
    out.mkdir()
    env = {**os.environ, MARK: marked, "PYTHONPATH": f"{BENCHMARKS}{os.pathsep}{ROOT}"}
    words = ("telemetry", "defaults (noise")
    command = [*TORCHRUN, "-m", "hostcost_kit.sharded", "--wrap", wrap, "--out", str(out)]
    command += ["--counts-only", "--counted", "100", "--only", *words]
    proc = processes.python(*command, env=env, text=True, cwd=ROOT)
    try:
        _, err = proc.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the {wrap} ranks did not count within {DEADLINE_S}s")
    assert proc.returncode == 0, err[-3000:]
    return [json.loads((out / f"rank{rank}.json").read_text())["counts"] for rank in range(2)]


def with_added(by_category: dict[str, int], added: dict[str, int]) -> dict[str, int]:
    return {k: by_category.get(k, 0) + added.get(k, 0) for k in by_category | added}


@pytest.mark.slow
@pytest.mark.parametrize("wrap", ["fsdp2", "ddp"])
def test_an_ordinary_sharded_step_costs_what_an_unsharded_one_does(processes, marked, wrap):  # noqa: F811
    """A multi-rank job's batch control exchanges at the end of every 8th step: before, it
    asked for the slow path at every step's end (every part asked in turn: 18 calls with
    telemetry, 26 with the defaults, against 4), now only at the exchanges' steps. Under DDP
    the noise scale's controller looked at every step (88 calls with the defaults), and its
    comm hook handed each bucket to torch's Python all-reduce hook; now it sees only the
    measured steps, and the hook, on the others, all-reduces as DDP itself does."""
    from hostcost_kit.counting import count_calls
    from hostcost_kit.setups import CONFIGS as SETUPS

    ranks = sharded_counts(processes, marked, wrap)
    for name in (TELEMETRY, DEFAULTS):
        unsharded = count_calls(SETUPS[name], "tiny", steps=100, warmup=120)
        assert unsharded.bsmon == 1, unsharded
        added = ADDED[wrap, name]
        expected = with_added(unsharded.by_category, added)
        for counts in ranks:
            sharded = counts[name]
            assert sharded["by_category"] == expected, (name, sharded, unsharded)
            assert sharded["ordinary"] == unsharded.ordinary + sum(added.values()), sharded
            assert sharded["bsmon"] == 1 + added.get("bsmon", 0), (name, sharded, unsharded)
