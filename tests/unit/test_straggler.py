"""The ranks view's straggler: the rank the others wait for (the most time of its own: data
wait and compute) and what makes it slow, in the agent's words (the dashboard only shows
them)."""

from __future__ import annotations

import msgspec
import pytest

from bsmon.probes.runtime.ranks import anatomy_timing, straggler
from bsmon.probes.wire.protocol import Metrics, RankReading, StepAnatomy


def rank(n: int, compute: float = 0.030, data: float | None = 0.002, wait: float | None = 0.010):
    return RankReading(
        rank=n, forward_s=compute / 3, backward_s=2 * compute / 3, data_s=data, comm_wait_s=wait
    )


def test_a_rank_that_computes_longer_is_slow_in_compute():
    readings = [rank(0), rank(1, compute=0.060, wait=0.001), rank(2), rank(3)]
    found = straggler(readings)
    assert found.rank == 1 and found.ratio == pytest.approx(0.062 / 0.032)
    assert found.cause == "r1 is slow in compute: 60.0 ms a step against the median rank's 30.0 ms"


def test_a_rank_that_waits_for_its_data_is_slow_in_data_wait_though_it_computes_no_more():
    readings = [rank(0), rank(1), rank(2, data=0.040, wait=0.001), rank(3)]
    found = straggler(readings)
    assert found.rank == 2 and found.ratio == pytest.approx(0.070 / 0.032)
    assert found.cause == "r2 is slow in data wait: 40.0 ms a step against the median rank's 2.0 ms"


def test_where_no_rank_stands_out_and_the_collectives_outlast_the_compute_they_are_named():
    readings = [rank(n, compute=0.030 + n * 0.0005, wait=0.150) for n in range(4)]
    found = straggler(readings)
    assert found.ratio < 1.10
    assert found.cause.startswith("no rank stands out: every rank waits 150.0 ms a step")
    assert "more than it computes (30.8 ms)" in found.cause


def test_where_nothing_stands_out_no_cause_is_given():
    found = straggler([rank(0), rank(1, compute=0.031)])
    assert found.rank == 1 and found.cause is None
    assert straggler([rank(0, wait=None), rank(1, wait=None)]).cause is None  # wait unknown
    late = RankReading(rank=2, forward_s=9.0, backward_s=9.0, late=True)
    assert straggler([rank(0), late]) == (None, None, None)  # one rank on time: no straggler


def test_without_ddp_a_ranks_compute_and_wait_come_from_its_step_anatomy():
    anatomy = StepAnatomy(steps=10, step_s=0.2, forward_s=0.02, backward_s=0.03, comm_s=0.14)
    metrics = Metrics(
        t=0.0, step=1, batch_size=16, step_time_s=0.2, samples_per_s=80.0, b_simple=None
    )
    assert anatomy_timing(metrics) == {}
    metrics.anatomy = anatomy
    assert anatomy_timing(metrics) == {"forward_s": 0.02, "backward_s": 0.03, "comm_wait_s": 0.14}


def test_a_slow_ranks_throttled_gpu_is_named_with_its_clock_and_power():
    slow = msgspec.structs.replace(
        rank(1, compute=0.060, wait=0.001), throttled="power cap", sm_clock_mhz=1410, power_w=699
    )
    found = straggler([rank(0), slow, rank(2), rank(3)])
    assert found.cause.endswith("; its GPU is throttled (power cap: 1410 MHz, 699 W)")
    calm = straggler([rank(0), rank(1, compute=0.060, wait=0.001), rank(2), rank(3)])
    assert "throttled" not in calm.cause
