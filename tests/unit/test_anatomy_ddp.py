"""The step anatomy's communication note when DistributedDataParallel sits inside a
framework's module (Lightning Fabric's ``_FabricModule``): the agent finds it with the same
``distributed.ddp_of`` as the noise scale, keeps the finding in the session (and the record's
header), and a reading without DDP's timing yet says so, not "the model is not
DistributedDataParallel" (issue 43)."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from bsmon.probes import attach
from bsmon.probes.anatomy.seconds import Phases, PhaseTotals
from bsmon.probes.anatomy.verdict import DDP_NOT_YET, DDP_SAMPLED, NO_DDP, judged
from bsmon.probes.runtime import session as session_module


def fabric_like(original: nn.Module, parallel: nn.Module) -> nn.Module:
    """What Fabric's setup hands back: a module holding the DDP model it forwards to and the
    user's original (only the holding matters here: the job never steps)."""
    holder = nn.Module()
    holder._forward_module = parallel
    holder._original_module = original
    return holder


@pytest.fixture
def gloo(tmp_path):
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


@pytest.fixture
def two_ranks(monkeypatch):
    """The session of rank 0 of two (the one real rank's process group is world size 1)."""
    fake = types.SimpleNamespace(world=lambda: (0, 2))
    monkeypatch.setattr(session_module, "distributed", fake)


@pytest.mark.parametrize("wrapped", [True, False])
def test_ddp_inside_a_frameworks_module_is_found_and_kept_in_the_record(
    gloo, two_ranks, tmp_path, wrapped
):
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    model = fabric_like(net, DistributedDataParallel(net)) if wrapped else net
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    record = tmp_path / "job.jsonl"
    with attach(model, optimizer, name="fabric", serve=False, record=str(record)) as mon:
        assert mon.session.world_size == 2
        assert mon.session.ddp is wrapped
    header = json.loads(Path(record).read_text("utf-8").splitlines()[0])
    assert header["session"]["ddp"] is wrapped


def split(comm_s: float | None) -> PhaseTotals:
    totals = PhaseTotals()
    for _ in range(20):
        totals.add(0.01, Phases(0.001, 0.003, 0.004, 0.001, 0.001))
    totals.comm_s = comm_s
    return totals


def test_the_communication_note_says_what_is_true_of_the_job():
    notes = {ddp: judged(split(None), 2, ddp=ddp).notes for ddp in (True, False, None)}
    assert DDP_NOT_YET in notes[True] and NO_DDP not in notes[True]
    assert NO_DDP in notes[False]
    assert not any("not DistributedDataParallel" in note for note in notes[None])  # unknown
    assert DDP_SAMPLED in judged(split(0.02), 2, ddp=True).notes
    assert not any(note.startswith("communication") for note in judged(split(None), 1).notes)
