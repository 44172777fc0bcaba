"""The step anatomy under FSDP2 (``fully_shard``): the calls that wait for its all-gathers
and reduce-scatters come out of the forward and backward they ran in as the comm phase, on
sampled steps only; the wrappers go at close and change nothing the job computes; a torch
whose FSDP2 differs gets "not measured" with the reason, never an error. (Two real ranks:
tests/processes/test_anatomy_fsdp2.py.)"""

from __future__ import annotations

import types

import pytest
import torch
import torch.distributed as dist
from torch import nn

from bsmon.probes import attach
from bsmon.probes.anatomy import collectives
from bsmon.probes.anatomy.collectives import METHODS, WATCHES, CollectiveMarks, CommMark
from bsmon.probes.anatomy.marks import PassMarks, StepMarks
from bsmon.probes.anatomy.phases import phases_of, with_comm
from bsmon.probes.anatomy.sampling import STRIDE_VARIABLE
from bsmon.probes.anatomy.seconds import Phases, PhaseTotals
from bsmon.probes.anatomy.verdict import FSDP2_MEASURED, anatomy_notes, judged
from bsmon.probes.runtime import session as session_module
from bsmon.probes.runtime.call_watch import CallWatch
from bsmon.probes.runtime.timing import StepClock
from bsmon.probes.wire.protocol import StepAnatomy

fsdp = pytest.importorskip("torch.distributed.fsdp")


def test_fsdp2s_collective_calls_come_out_of_the_phase_they_ran_in():
    # forward 0-5 with an all-gather 1-3; backward 5-10 with a reduce-scatter 7-8 and the
    # final wait 9.5-10; the optimizer 10-11. The collectives themselves: 1.5-3 and 7-7.5
    calls = (CommMark(1.0, 3.0, 1.0), CommMark(7.0, 8.0, 7.0), CommMark(9.5, 10.0, 9.5))
    ops = (CommMark(1.5, 3.0, 1.5), CommMark(7.0, 7.5, 7.0))
    passes = (PassMarks(None, 5.0, 10.0, 5.0),)
    marks = StepMarks(passes, 10.0, 10.0, 0.0, 0, comm=calls, comm_ops=ops)
    phases = phases_of(marks, 0.0, 11.0, 11.0)
    assert phases == Phases(None, 3.0, 3.5, 1.0, 0.0, comm=3.5, comm_total=2.0)
    assert with_comm(phases, 0.25) == phases  # DDP's sample never replaces what was timed
    unseen = phases_of(marks._replace(comm_ops=()), 0.0, 11.0, 11.0)
    assert unseen.comm == 3.5 and unseen.comm_total is None  # not seen: not 0


def split(comm_s: float | None, total_s: float | None = None) -> PhaseTotals:
    totals = PhaseTotals()
    for _ in range(20):
        totals.add(0.01, Phases(None, 0.002, 0.002, 0.001, 0.001, comm_s, total_s))
    return totals


def test_an_fsdp2_reading_says_whose_collectives_they_are_and_judges_them_so():
    reading = judged(split(0.004, 0.005), 2, ddp=False, fsdp2=True)
    assert FSDP2_MEASURED in reading.notes
    assert reading.comm_total_s == pytest.approx(0.005)
    assert "collectives: 5.0 ms a step in all, 20% of it hidden behind compute" in reading.notes
    assert reading.verdict == "communication-bound"
    assert "waits for FSDP2's all-gathers and reduce-scatters (4.0 ms of 10.0 ms)" in (
        reading.evidence
    )
    assert "reshard_after_forward" in reading.advice and "bucket_cap_mb" not in reading.advice
    unseen = judged(split(None), 2, ddp=False, fsdp2=True)
    assert "communication: not measured (no FSDP2 collective in these steps)" in unseen.notes
    why = "torch 9's FSDP2 parameter groups have no unshard()"
    notes = anatomy_notes(StepAnatomy(steps=1, step_s=0.01), 2, False, True, why)
    assert f"communication: not measured ({why})" in notes


def test_where_fsdp2s_internals_differ_nothing_is_wrapped_and_the_reason_is_said(monkeypatch):
    assert "no not_a_method()" in collectives._locate("not_a_method")()
    why = "torch 9's FSDP2 parameter groups have no unshard()"
    monkeypatch.setattr(collectives, "WATCHES", (CallWatch(lambda: why),))
    marks = CollectiveMarks(StepClock())
    marks.install()
    marks.arm()
    assert not marks.armed and marks.why_not == why and marks.take() == ((), ())
    marks.disarm()


def test_where_only_the_collective_calls_are_not_found_the_wait_is_still_timed(monkeypatch):
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    gone = (CallWatch(lambda: "torch.distributed has no all_gather_single()"),)
    monkeypatch.setattr(collectives, "COLLECTIVES", gone)
    marks = CollectiveMarks(StepClock())
    marks.install()
    marks.arm()
    try:
        assert marks.armed and marks.why_not is None
        assert FSDPParamGroup.__dict__["unshard"] is not FSDPParamGroup.unshard.__wrapped__
    finally:
        marks.disarm()
    assert not any(watch.installed for watch in WATCHES)


@pytest.fixture
def one_rank_of_two(tmp_path, monkeypatch):
    """A real gloo process group of one rank (FSDP2 calls its collective methods on it, each
    a copy), seen by the session as rank 0 of two so that bsmon treats the job as sharded."""
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1
    )
    monkeypatch.setattr(session_module, "distributed", types.SimpleNamespace(world=lambda: (0, 2)))
    yield
    dist.destroy_process_group()


def sharded_mlp() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
    model.append(nn.Linear(32, 1))
    fsdp.fully_shard(model[0])
    fsdp.fully_shard(model[2])
    return fsdp.fully_shard(model)


def train(
    model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, before=lambda: None
) -> list[float]:
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        before()
        x, y = torch.randn(16, 8, generator=gen), torch.randn(16, 1, generator=gen)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_sampled_fsdp2_steps_time_the_collective_calls_change_nothing_and_close_unwraps(
    one_rank_of_two, monkeypatch
):
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    originals = {name: FSDPParamGroup.__dict__[name] for name in METHODS}

    def is_wrapped() -> bool:
        return any(FSDPParamGroup.__dict__[name] is not originals[name] for name in METHODS)

    plain = sharded_mlp()
    plain_losses = train(plain, torch.optim.SGD(plain.parameters(), lr=0.05), 40)
    monkeypatch.setenv(STRIDE_VARIABLE, "2")  # every other step sampled
    model = sharded_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    options = {"serve": False, "record": False, "noise_scale": None, "ranks_view": False}
    with attach(model, optimizer, **options) as mon:
        assert mon.session.fsdp2 is True
        wrapped = []
        losses = train(model, optimizer, 40, lambda: wrapped.append(is_wrapped()))
        mon.flush()
        reading = mon.stats()["anatomy"]
    assert losses == plain_losses  # bit for bit: the wrappers only read the clock
    assert 15 <= sum(wrapped) <= 21  # the sampled steps only: every other one, from step 2
    assert reading["comm_s"] > 0 and reading["steps"] >= 15, reading
    assert "comm_total_s" not in reading  # one rank: FSDP2 copies, it calls no collective
    assert FSDP2_MEASURED in reading["notes"]
    assert {name: FSDPParamGroup.__dict__[name] for name in METHODS} == originals
    assert not any(watch.installed for watch in WATCHES)


def test_a_plain_model_in_a_distributed_job_wraps_nothing_of_fsdp2(one_rank_of_two):
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    options = {"serve": False, "record": False, "noise_scale": None, "ranks_view": False}
    with attach(model, optimizer, **options) as mon:
        assert mon.session.fsdp2 is False and mon._phases.collectives is None
