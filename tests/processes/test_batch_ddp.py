"""Two DDP ranks (real processes, gloo on CPU) switch batch size at the same step."""

from __future__ import annotations

import json

from ..helpers import ROOT


def test_two_ranks_switch_at_the_same_step(bsmon_dir, processes, tmp_path):
    init_file = tmp_path / "init"
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    ranks = [
        processes.python(
            str(ROOT / "tests" / "ddp_batch_worker.py"),
            str(r),
            "2",
            str(init_file),
            str(outs[r]),
            cwd=ROOT,
        )
        for r in range(2)
    ]
    for rank in ranks:
        _, err = rank.communicate(timeout=240)
        assert rank.returncode == 0, err.decode()
    logs = [json.loads(out.read_text()) for out in outs]
    sizes = [[entry["batch_size"] for entry in log["log"]] for log in logs]
    assert sizes[0] == sizes[1]  # every rank, every step, the same batch size
    switch_steps = [next(e["step"] for e in log["log"] if e["batch_size"] == 16) for log in logs]
    # asked after step 5; carried by the exchange at boundary 8, applied at boundary 16
    assert switch_steps[0] == switch_steps[1] == logs[0]["applies_after"] == 16
    drawn = [[e["drawn"] for e in log["log"]] for log in logs]
    assert drawn[0] == drawn[1] and 16 in drawn[0]
    assert "send batch-size commands to rank 0" in logs[1]["refused"]
