"""The faces a new extension plugs in through (docs/architecture.md, 'Adding an extension'):
what its class defines is called, in order, with nothing in ``Monitor`` naming it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bsmon.probes import attach
from bsmon.probes.agent import assemble
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
