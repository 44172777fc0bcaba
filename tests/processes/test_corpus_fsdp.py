"""Frameworks' sharded training under `bsmon run`, unmodified, on two real ranks over gloo
started by torchrun: the script's output and exit code unchanged, steps and samples exact on
every rank, and the noise scale from the estimator the sharding allows. Lightning's FSDP2
strategy (ModelParallelStrategy) shards with ``fully_shard``: the sharded estimator.
accelerate's FSDP plugin is not applied on a CPU (accelerate trains such a job as MULTI_CPU,
DDP): the ddp estimator, which pins what bsmon does with the job accelerate actually runs.
DeepSpeed ZeRO-1/2: per-example norms and the ZeRO optimizer's own pre-clipping norm of the
averaged gradient, against the same model and batches under DDP; ZeRO-3: off, saying why."""

from __future__ import annotations

import msgspec
import pytest

from bsmon.probes.noise.budget import BUDGET_VARIABLE, EVERY_STEP

from ..watch import kill_run_processes
from .test_corpus import ATTACH, RUN, bare, run, summary_of
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


ZERO = "deepspeed_zero.py"
ZERO_STEPS = 100  # 1,280 examples over 2 ranks in batches of 32, 5 epochs


@pytest.mark.slow
def test_deepspeed_zero2_measures_what_ddp_measures_on_the_same_batches(
    bsmon_dir, tmp_path, monkeypatch
):
    # without clipping (DeepSpeed clips at 1.0 by default) the two train the same weights
    monkeypatch.setenv(BUDGET_VARIABLE, EVERY_STEP)
    records = run_unchanged(ZERO, ("--stage", "2", "--clip", "0"), bsmon_dir, tmp_path)
    reference = run(ZERO, ("--engine", "ddp"), ATTACH, tmp_path / "ddp", TORCHRUN, TIMEOUT_S)
    assert reference.code == 0, reference.stderr[-2000:]
    assert len(reference.records) == 2
    ddp = summary_of(reference.records[0]).b_simple.end
    for record in records:
        summary = summary_of(record)
        assert summary.steps == ZERO_STEPS and summary.samples == ZERO_STEPS * 32
        assert not ddp_flag(record)
        zero = summary.b_simple.end
        assert zero is not None and ddp is not None, summary.b_simple.note
        assert abs(zero / ddp - 1) <= 0.10, (zero, ddp)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 3])
def test_deepspeed_zero_at_its_defaults(stage, bsmon_dir, tmp_path, monkeypatch):
    """ZeRO-1 clips the gradient before the torch optimizer's step (at norm 1.0): read there,
    |ḡ|² would be 1 every step and no estimate would come; bsmon reads the norm the ZeRO
    optimizer took before clipping. ZeRO-3 partitions the parameters: off, saying so."""
    monkeypatch.setenv(BUDGET_VARIABLE, EVERY_STEP)
    for record in run_unchanged(ZERO, ("--stage", str(stage)), bsmon_dir, tmp_path):
        summary = summary_of(record)
        assert summary.steps == ZERO_STEPS and summary.samples == ZERO_STEPS * 32
        if stage == 3:
            assert summary.b_simple.end is None and "ZeRO-3" in summary.b_simple.note
        else:
            assert summary.b_simple.end is not None, summary.b_simple.note
