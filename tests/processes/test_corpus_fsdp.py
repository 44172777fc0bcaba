"""Frameworks' FSDP under `bsmon run`, unmodified, on two real ranks over gloo started by
torchrun: the script's output and exit code unchanged, steps and samples exact on every rank,
and the noise scale from the estimator the sharding allows. Lightning's FSDP2 strategy
(ModelParallelStrategy) shards with ``fully_shard``: the sharded estimator. accelerate's FSDP
plugin is not applied on a CPU (accelerate trains such a job as MULTI_CPU, DDP): the ddp
estimator, which pins what bsmon does with the job accelerate actually runs."""

from __future__ import annotations

import msgspec
import pytest

from ..watch import kill_run_processes
from .test_corpus import RUN, bare, run, summary_of
from .test_corpus_ddp import TORCHRUN

TIMEOUT_S = 400


@pytest.fixture(autouse=True)
def no_strays(bsmon_dir):
    """torchrun's workers run in sessions of their own: killed after each test."""
    yield
    kill_run_processes(bsmon_dir)


def run_unchanged(script: str, args: tuple[str, ...], bsmon_dir, tmp_path) -> list:
    """The script bare and under `bsmon run`: same exit code and stdout; one record per rank."""
    plain = bare(script, args, str(tmp_path), TORCHRUN)
    assert plain.code == 0, plain.stderr[-2000:]
    outcome = run(script, args, RUN, bsmon_dir, TORCHRUN, TIMEOUT_S)
    assert outcome.code == 0, outcome.stderr[-2000:]
    assert outcome.stdout == plain.stdout
    assert len(outcome.records) == 2, outcome.records
    return outcome.records


def ddp_flag(record) -> bool:
    return msgspec.json.decode(record.read_bytes().split(b"\n", 1)[0])["session"]["ddp"]


@pytest.mark.slow
def test_lightning_fsdp2_strategy_under_bsmon_run(bsmon_dir, tmp_path, monkeypatch):
    # 640 examples over 2 ranks in batches of 32: 10 steps an epoch on each rank; every step
    # measured, so an estimate comes whatever the machine's load (at the default budget, a
    # busy machine measured 16 of the 120 steps and there was none), the last steps' too
    # (an idle machine ran the 120 steps in about a second, and before the ranks' exchange
    # finished at close only 14 came back)
    monkeypatch.setenv("BSMON_NOISE_BUDGET", "all")
    for record in run_unchanged("lightning_fsdp.py", ("--epochs", "12"), bsmon_dir, tmp_path):
        summary = summary_of(record)
        assert summary.steps == 120 and summary.samples == 120 * 32
        # not DDP, and not "each rank training on its own": the shards' |G|² summed (FSDP2)
        assert not ddp_flag(record)
        assert summary.b_simple.end is not None, summary.b_simple.note


@pytest.mark.slow
def test_accelerate_fsdp_plugin_on_cpu_under_bsmon_run(bsmon_dir, tmp_path):
    # 640 examples over 2 ranks in batches of 16: 20 steps an epoch on each rank
    for record in run_unchanged("accelerate_fsdp.py", ("--epochs", "5"), bsmon_dir, tmp_path):
        summary = summary_of(record)
        assert summary.steps == 100 and summary.samples == 100 * 16
        assert ddp_flag(record)  # accelerate wrapped it in DDP, not FSDP, on a CPU
        assert summary.b_simple.end is not None, summary.b_simple.note
