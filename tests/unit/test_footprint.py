"""What a rank holds whatever its batch (``footprint``), the memory bound that leaves it out
of the scaling, and a sharded job's price of growing by accumulation (``regather``) in the
step-time model. The sharded figures on real ranks: tests/processes/test_sharded_memory.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from bsmon.probes.batch.footprint import Footprint, footprint_of
from bsmon.probes.batch.goodput import Regather, StepTimeModel
from bsmon.probes.batch.memory_model import MemoryModel
from bsmon.probes.batch.regather import ASSUMED_BANDWIDTH, RegatherCost
from bsmon.probes.batch.safety import memory_reason

GIB = 2**30


def test_an_unsharded_models_footprint_is_its_parameters_gradients_and_adams_state():
    model = nn.Linear(4, 8)  # 40 floats
    optimizer = torch.optim.Adam(model.parameters())
    assert footprint_of(model, optimizer) == Footprint(parameters=160, gradients=160, optimizer=0)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    footprint = footprint_of(model, optimizer)
    # Adam: two moments per parameter, and a step count (a float32 tensor) per tensor
    assert footprint.optimizer == 2 * 160 + 2 * 4
    assert (footprint.gathered, footprint.per_micro_batch, footprint.shards) == (0, 0, 1)
    assert footprint.held == 160 + 328 and footprint.fixed == 160 + 160 + 328


def test_the_bound_from_one_size_scales_only_what_grows_with_the_batch():
    """A rank holding 6 GiB whatever its batch, 4 GiB of activations at batch 8: at 16 the
    peak is 14 GiB, and the bound says so, where scaling the whole peak said 20."""
    model = MemoryModel()
    model.observe(8, 10 * GIB, steps=5)
    assert model.proportional_bound(16) == pytest.approx(20 * GIB)
    model.footprint = Footprint(parameters=2 * GIB, gradients=2 * GIB, optimizer=4 * GIB, shards=2)
    assert model.proportional_bound(16) == pytest.approx(14 * GIB)
    why = memory_reason(
        16, 8, device=model, device_budget=15 * GIB, host=MemoryModel(), host_budget=None
    )
    assert why is not None and "above the 6.0 GiB every step holds" in why
    assert "14.0 GiB, 93% of the 15.0 GiB device available" in why
    # a footprint above a reading (resident memory read early, say) scales the whole reading
    model.footprint = Footprint(parameters=12 * GIB, gradients=0, optimizer=0)
    assert model.proportional_bound(16) == pytest.approx(10 * GIB)


def line(step_s: float = 0.1, size: int = 64) -> StepTimeModel:
    """One size measured: AdaptDL's prior, half the step fixed."""
    return StepTimeModel(step_s / 2, step_s / (2 * size), "assumed: one size measured")


def test_a_sharded_jobs_time_per_example_at_two_micro_batches_exceeds_the_unsharded_ones():
    """From one micro-batch of 64 to two, each re-gathering the parameters for 20 ms: the
    sharded job's time per example at 128 is the unsharded one's plus 20 ms over 128."""
    unsharded = line()
    sharded = unsharded.with_regather(Regather(64, base=1, seconds=0.02, how="estimated"))
    extra = sharded.step_time(128) / 128 - unsharded.step_time(128) / 128
    assert extra == pytest.approx(0.02 / 128)
    assert sharded.step_time(64) == unsharded.step_time(64)  # the size it measured
    assert sharded.step_time(32) == unsharded.step_time(32)  # a smaller size: the line's
    assert sharded.speed_ratio(128, 64) < unsharded.speed_ratio(128, 64)
    assert sharded.speed_ratio(128, 64) == pytest.approx((128 / 0.17) / (64 / 0.1))
    price = sharded.price(128, 64)
    assert price is not None and "1 more micro-batch of 64 per step" in price
    assert "+20.0 ms a step (20.0 ms each, estimated)" in price and sharded.price(32, 64) is None


def test_a_line_the_job_measured_at_two_sizes_already_holds_the_regather():
    fitted = StepTimeModel(0.01, 0.001, "fitted from 2 sizes")
    regather = Regather(64, base=1, seconds=0.02, how="estimated")
    assert fitted.with_regather(regather).regather is None
    assert fitted.with_regather(regather).how == "fitted from 2 sizes, each with its re-gathers"


def sharded_footprint(per_micro_batch: int = 40_000_000) -> Footprint:
    return Footprint(1, 1, 1, gathered=1, per_micro_batch=per_micro_batch, shards=2)


def test_the_regather_is_estimated_from_the_bytes_gathered_or_taken_as_measured():
    anatomy = SimpleNamespace(comm_s=None)
    cost = RegatherCost(
        sharded_footprint,
        micro_batch=lambda: 32,
        world_size=2,
        device_type="cpu",
        anatomy=lambda: anatomy,
    )
    estimated = cost.at(64)
    assert estimated is not None and (estimated.base, estimated.micro_batch) == (2, 32)
    # half the bytes come from the other rank
    assert estimated.seconds == pytest.approx(20e6 / ASSUMED_BANDWIDTH["cpu"])
    assumed = f"at an assumed {ASSUMED_BANDWIDTH['cpu'] / 1e9:g} GB/s on cpu"
    assert f"38.1 MiB gathered per micro-batch {assumed}" in estimated.how
    anatomy.comm_s = 0.05  # FSDP2's collectives held a step of two micro-batches 50 ms
    measured = cost.at(64)
    assert measured is not None and measured.seconds == pytest.approx(0.025)
    assert measured.how == (
        "measured: FSDP2's collective wait in the step anatomy, 50.0 ms a step of 2 micro-batches"
    )


@pytest.mark.parametrize(
    ("footprint", "micro"),
    [(sharded_footprint(), None), (Footprint(1, 1, 1), 32), (sharded_footprint(0), 32)],
    ids=["no accumulation", "not sharded", "kept unsharded"],
)
def test_no_regather_without_accumulation_sharding_or_resharding(footprint, micro):
    cost = RegatherCost(
        lambda: footprint, micro_batch=lambda: micro, world_size=2, device_type="cuda"
    )
    assert cost.at(64) is None
