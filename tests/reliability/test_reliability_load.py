"""Load: a job making thousands of steps a second. The agent keeps up (every sample counted,
none dropped from its inbox) in memory that does not grow with the steps. The speed itself is
a figure in benchmarks/reliability.py, never a pass/fail here."""

from __future__ import annotations

import tracemalloc

import torch

from bsmon.probes import attach
from bsmon.probes.runtime.inbox import CAPACITY
from bsmon.probes.wire import protocol
from bsmon.probes.wire.client import JobConnection

BATCH = 4


def fast_steps(optimizer: torch.optim.Optimizer, mon, count: int) -> None:
    """The cheapest real step there is: the optimizer's, with gradients already in place."""
    for _ in range(count):
        mon.job.count_samples(BATCH)  # as a loader bsmon did not make would, before the step
        optimizer.step()


def errors_of(mon) -> list[str]:
    """What the agent said went wrong, and whether its thread still runs."""
    said = [e.message for e in mon.job.telemetry.events if e.level == "error"]
    service = mon._service
    return [
        *said,
        f"faults {mon._guard.count}, agent alive {service.is_alive()}",
        service.startup_error,
    ]


def test_a_job_of_thousands_of_steps_a_second_loses_no_sample_in_bounded_memory(bsmon_dir):
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    model(torch.ones(1, 2)).sum().backward()
    mon = attach(model, optimizer, name="fast", record=True, sample_interval_s=0.05)
    with mon, JobConnection(mon.socket_path) as conn:
        conn.hello()
        # warm: history, buckets and events reach size, and every slot of the step ring holds
        # a step's own end time (a float object each: 24 bytes a slot until the ring is full)
        fast_steps(optimizer, mon, CAPACITY + 5_000)
        assert mon.flush(30)
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            fast_steps(optimizer, mon, 20_000)
            assert mon.flush(30), errors_of(mon)
            grown = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
        stats = mon.stats()
        steps = CAPACITY + 25_000
        assert stats["step"] == steps and stats["samples"] == steps * BATCH
        assert stats["errors"] == 0, errors_of(mon)
        assert grown < 256 << 10, f"{grown} bytes more after 20,000 steps"  # < 14 bytes a step
        metrics = [m for m in conn.messages(0.5) if isinstance(m, protocol.Metrics)]
        assert metrics and metrics[-1].step == steps
