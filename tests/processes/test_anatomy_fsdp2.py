"""FSDP2 (``fully_shard``) on 2 real gloo ranks started by torchrun (workloads/sharded_job.py):
every rank's step anatomy has the comm phase, the time its sampled steps waited in FSDP2's
all-gathers and reduce-scatters, and their total time (none hidden on a CPU); rank 0's ranks
view carries each rank's compute and collective wait, with the straggler named."""

from __future__ import annotations

import pytest

from bsmon.probes.anatomy.sampling import STRIDE_VARIABLE
from bsmon.probes.anatomy.verdict import FSDP2_MEASURED
from bsmon.probes.runtime.ranks import FSDP2_TIMING

from .test_noise_sharded import attached_run, marked  # noqa: F401  (marked: a fixture)

PHASES = ("data_s", "forward_s", "backward_s", "optimizer_s", "comm_s", "other_s")


@pytest.mark.slow
def test_fsdp2s_collectives_are_the_comm_phase_and_the_ranks_view_shows_each_ranks_wait(
    processes,
    marked,  # noqa: F811
    monkeypatch,
):
    monkeypatch.setenv(STRIDE_VARIABLE, "2-4")  # many sampled steps in a short run
    # long enough for rank 1's summaries (every 2 s) to reach rank 0 after its first reading
    results = attached_run(processes, marked, "fsdp2", "--steps", "300")
    for result in results:
        anatomy = result["anatomy"]
        assert result["errors"] == 0 and anatomy is not None, result
        assert anatomy["comm_s"] > 0 and FSDP2_MEASURED in anatomy["notes"], anatomy
        assert anatomy["forward_s"] > 0 and anatomy["backward_s"] > 0, anatomy
        parts = sum(anatomy.get(phase) or 0.0 for phase in PHASES)
        assert parts == pytest.approx(anatomy["step_s"], rel=1e-6), anatomy
        # the collectives' own time: gloo's block the training thread on a CPU, inside the
        # calls that wait for them, so none of it hides behind compute
        assert 0 < anatomy["comm_total_s"] <= anatomy["comm_s"], anatomy
        assert any("0% of it hidden behind compute" in note for note in anatomy["notes"])
    view = results[0]["ranks"]
    assert results[1]["ranks"] is None  # rank 0 gathers the view
    assert view["timing"] == FSDP2_TIMING
    assert [r["rank"] for r in view["ranks"]] == [0, 1]
    for rank in view["ranks"]:
        assert rank["comm_wait_s"] > 0 and rank["forward_s"] > 0, view
    assert view["straggler"] in (0, 1) and view["straggler_ratio"] >= 1.0, view
