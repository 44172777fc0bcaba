"""The faces a new extension plugs in through (docs/architecture.md, 'Adding an extension'):
what its class defines is called, in order, with nothing in ``Monitor`` naming it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bsmon.probes import attach
from bsmon.probes.agent import assemble
from bsmon.probes.agent.boundary import Boundary
from bsmon.probes.runtime.hot_path import FINISHED, NEVER
from bsmon.probes.runtime.service import AgentService, Extension
from bsmon.probes.runtime.steps import StepRun


class Spy(Extension):
    def __init__(self) -> None:
        self.steps: list[int] = []
        self.calls: list[str] = []

    def on_steps(self, run: StepRun) -> None:
        self.steps += run.steps

    def detach(self) -> None:
        self.calls.append("detach")

    def last_word(self) -> None:
        self.calls.append("last_word")


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Spy:
    """A spy registered as the last extension (where assemble's one line would put it)."""
    spy = Spy()

    def service(**parts: object) -> AgentService:
        return AgentService(**{**parts, "extensions": [*parts["extensions"], spy]})  # type: ignore[arg-type]

    monkeypatch.setattr(assemble, "AgentService", service)
    return spy


def test_an_extension_reads_the_steps_then_detaches_then_has_its_last_word(spy):
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, optimizer, serve=False, record=False, noise_scale=None) as mon:
        for _ in range(6):
            optimizer.zero_grad()
            model(torch.randn(8, 4)).sum().backward()
            optimizer.step()
        assert mon.flush()
        assert spy.calls == []
    assert spy.steps == list(range(spy.steps[0], spy.steps[0] + len(spy.steps)))
    assert spy.steps[-1] == 6
    assert spy.calls == ["detach", "last_word"]


class Scheduled(Extension):
    """Asks for the end of every step until ``last``, then says its work is over."""

    def __init__(self, last: int) -> None:
        self.last = last
        self.asked: list[int] = []

    def at_boundary(self, step: int, now: float) -> int:
        self.asked.append(step)
        return step + 1 if step < self.last else FINISHED


class Hot:
    """The hot path's flags the boundary sets (runtime.hot_path.HotPath's)."""

    noise_due = sampling = False

    def need_pre_hook(self, needed: bool) -> None:
        assert not needed


def test_a_part_whose_boundary_work_is_over_is_not_asked_again():
    """The slow path runs on every step the noise scale measures: a part done for good leaves
    it (FINISHED), the others are asked on, and the soonest step any of them wants is next."""
    done, busy = Scheduled(last=3), Scheduled(last=10**9)
    boundary = Boundary([done, busy], Hot())
    following = [boundary.at_boundary(step, 0.0) for step in range(1, 8)]
    assert done.asked == [1, 2, 3]
    assert busy.asked == list(range(1, 8))
    assert following == list(range(2, 9))
    alone = Boundary([Scheduled(last=1)], Hot())
    assert alone.at_boundary(1, 0.0) == NEVER  # none left wants a step: none is scheduled
