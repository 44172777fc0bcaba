"""Two DDP ranks (real processes, gloo on CPU) switch batch size at the same step: asked for
at rank 0, and decided by rank 0's autopilot; two FSDP2 ranks (``fully_shard``) likewise."""

from __future__ import annotations

import json

import pytest

from ..helpers import ROOT


def two_ranks(processes, tmp_path, *mode: str) -> list[dict]:
    """Run ddp_batch_worker.py as two ranks; what each wrote."""
    init_file = tmp_path / "init"
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    ranks = [
        processes.python(
            str(ROOT / "tests" / "ddp_batch_worker.py"),
            str(r),
            "2",
            str(init_file),
            str(outs[r]),
            *mode,
            cwd=ROOT,
        )
        for r in range(2)
    ]
    for rank in ranks:
        _, err = rank.communicate(timeout=240)
        assert rank.returncode == 0, err.decode()
    return [json.loads(out.read_text()) for out in outs]


@pytest.mark.parametrize("wrap", ["ddp", "fsdp2"])
def test_two_ranks_switch_at_the_same_step(wrap, bsmon_dir, processes, tmp_path):
    logs = two_ranks(processes, tmp_path, wrap)
    sizes = [[entry["batch_size"] for entry in log["log"]] for log in logs]
    assert sizes[0] == sizes[1]  # every rank, every step, the same batch size
    switch_steps = [next(e["step"] for e in log["log"] if e["batch_size"] == 16) for log in logs]
    # asked after step 5; carried by the exchange at boundary 8, applied at boundary 16
    assert switch_steps[0] == switch_steps[1] == logs[0]["applies_after"] == 16
    drawn = [[e["drawn"] for e in log["log"]] for log in logs]
    assert drawn[0] == drawn[1] and 16 in drawn[0]
    assert "send batch-size commands to rank 0" in logs[1]["refused"]


def test_rank_0s_autopilot_changes_every_ranks_batch_and_learning_rate_at_the_same_step(
    bsmon_dir, processes, tmp_path
):
    logs = two_ranks(processes, tmp_path, "autopilot")
    assert logs[0]["decisions"] and logs[0]["decisions"][0] == 16  # 8 → 16, within 2×
    assert logs[1]["decisions"] is None  # rank 1 has no autopilot: rank 0 decides for all
    steps = [[(e["step"], e["batch_size"], e["lr"]) for e in log["log"]] for log in logs]
    assert steps[0] == steps[1]  # every rank, every step: the same size and learning rate
    first = next(e for e in logs[0]["log"] if e["batch_size"] == 16)
    assert first["lr"] == pytest.approx(0.04)  # the linear rule for SGD, on both ranks
