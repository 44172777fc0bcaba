"""A sharded job's memory on real ranks (FSDP2, 2 gloo ranks under torchrun,
workloads/sharded_job.py, in accumulation mode: two micro-batches of 16 a step): batch
control's memory model reads each rank's footprint from its shards; the probe, which cannot
model a sharded job, says why in its answer, in what the dashboard greys ``p`` with, and in
the record; the advisor prices one more micro-batch's re-gather from the bytes gathered."""

from __future__ import annotations

import sys

import msgspec
import pytest

from bsmon.probes.batch.regather import ASSUMED_BANDWIDTH
from bsmon.probes.maxbatch.job import SHARDED

from .test_noise_sharded import attached_run, marked  # noqa: F401 (marked: its fixture)


@pytest.mark.slow
def test_each_ranks_footprint_is_its_shards_and_the_probe_says_why_it_cannot_run(
    processes,
    marked,  # noqa: F811 (the fixture imported above)
    bsmon_dir,
):
    args = ("--steps", "20", "--accumulate", "2", "--micro", "--optimizer", "adam", "--memory")
    ranks = attached_run(processes, marked, "fsdp2", *args)
    assert [rank["samples"] for rank in ranks] == [20 * 2 * 16] * 2
    memory = [rank["memory"] for rank in ranks]
    whole, block = memory[0]["whole_bytes"], memory[0]["block_bytes"]
    for counted in memory:
        footprint = counted["footprint"]
        assert footprint is not None, counted
        # this rank's shards (p.to_local()), never the whole model's size
        assert footprint["parameters"] == footprint["gradients"] == counted["local_bytes"]
        assert footprint["optimizer"] == counted["state_bytes"] > 2 * counted["local_bytes"]
        assert footprint["shards"] == 2
        # the largest group gathered whole: a block; each micro-batch after a step's first
        # gathers each block twice (forward and backward: resharded after each), the root's
        # own parameters once (FSDP2 keeps the root's whole from forward to backward)
        assert footprint["gathered"] == block
        assert footprint["per_micro_batch"] == 2 * 2 * block + (whole - 2 * block)
        assert counted["probe_blocked"] == SHARDED
    assert sum(counted["local_bytes"] for counted in memory) == whole
    regather = memory[0]["regather"]  # the advisor's, on rank 0
    assert (regather["micro_batch"], regather["base"]) == (16, 2)
    if regather["how"].startswith("measured: "):  # a step anatomy that times FSDP2's wait
        assert regather["seconds"] > 0 and "a step of 2 micro-batches" in regather["how"]
    else:  # estimated: half the bytes each micro-batch gathers come from rank 1
        gathered = memory[0]["footprint"]["per_micro_batch"]
        assert regather["seconds"] == pytest.approx(gathered / 2 / ASSUMED_BANDWIDTH["cpu"])
        assert "no all-gather time measured" in regather["how"]
    status, error = memory[0]["probe"]
    assert status == "refused" and error.endswith(SHARDED)
    assert memory[1]["probe"][0] == "refused"  # rank 1 sends probes to rank 0's monitor
    said = {}  # rank -> the messages of its probe_unavailable events
    for record in (bsmon_dir / "records").glob("*.jsonl"):
        header, *lines = map(msgspec.json.decode, record.read_bytes().splitlines())
        kind = [line["message"] for line in lines if line.get("kind") == "probe_unavailable"]
        said[header["session"]["rank"]] = kind
    assert said == {0: [SHARDED], 1: []}  # rank 0, which takes the probe command, says it


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
