"""The hot path's short path: an ordinary step records its end and batch size and nothing
else; whatever gives a step more to record sends it down the full path, and nothing it
records is lost (``runtime.progress``, ``runtime.hot_path``)."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from bsmon.probes import attach


@pytest.fixture
def job():
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 4), torch.randn(8, 2)
    mon = attach(
        model, optimizer, batch_size=8, serve=False, record=False, noise_scale=None,
        step_anatomy=False,
    )  # fmt: skip

    def step() -> None:
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    yield mon, model, step
    mon.close()


def settled(mon, step, most: int = 400) -> None:
    """Steps until the next one is ordinary (the start's boundaries are behind)."""
    for _ in range(most):
        step()
        if mon._progress.quiet and mon._hot.next_boundary > mon.step + 1:
            return
    raise AssertionError("no step became ordinary")


def test_an_ordinary_step_records_its_end_and_the_declared_size(job):
    mon, _, step = job
    settled(mon, step)
    before = mon.step
    for _ in range(5):
        step()
    ring = mon._inbox.ring
    assert mon.step == ring.written == before + 5
    slots = [s & ring.mask for s in range(before + 1, before + 6)]
    assert all(ring.declared[s] == 8 for s in slots)
    ends = [ring.ends[s] for s in slots]
    assert ends == sorted(ends) and ends[-1] <= time.perf_counter()
    assert mon._progress.quiet


def test_counted_samples_take_the_full_path_and_are_counted(job):
    mon, _, step = job
    settled(mon, step)
    assert mon.flush()
    samples = mon.job.telemetry.samples
    mon.job.count_samples(3)
    assert not mon._progress.quiet
    step()
    assert mon.flush()
    assert mon.job.telemetry.samples == samples + 3  # the counted step's own, not the declared 8
    step()  # the step after it resets what the counted one left (passes_known)
    step()
    assert mon._progress.quiet


def test_an_evaluation_between_steps_is_kept_out_of_the_step(job):
    mon, model, step = job
    settled(mon, step)
    assert mon.flush()
    model.eval()
    with torch.no_grad():
        deadline = time.perf_counter() + 0.05
        while time.perf_counter() < deadline:
            model(torch.randn(8, 4))
    model.train()
    assert not mon._progress.quiet
    step()
    assert mon.flush()
    assert mon.job.telemetry.eval_s >= 0.04


def test_micro_batches_reset_at_the_step_that_takes_them(job):
    mon, _, step = job
    settled(mon, step)
    assert mon.should_step()  # one micro-batch a step: step now
    assert not mon._progress.quiet
    step()
    assert mon._hot.micro_batches == 0
    assert mon.should_step()


def test_a_tensor_handed_back_is_dropped_by_the_next_step(job):
    mon, _, step = job
    settled(mon, step)
    held = [torch.ones(1) for _ in range(3)]
    mon._hot.hand_back(held, over_steps=1)
    del held
    assert not mon._progress.quiet
    step()
    assert mon._hot._handed_back == []


def test_a_wake_takes_the_full_path_whatever_quiet_says(job):
    mon, _, step = job
    settled(mon, step)
    boundaries = []
    work = mon._hot._work
    original = work.on_boundary
    work.on_boundary = lambda s, now: boundaries.append(s) or original(s, now)
    mon._hot.wake()
    step()
    assert boundaries == [mon.step]
