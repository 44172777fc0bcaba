"""The examples a step counts and the batch size shown: a count that changes every step is
shown as varying, not frozen at its first value, and a one-dimensional input is counted by
the rule the noise scale applies to a layer's input (docs/zero-code.md, "Samples")."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bsmon.probes import attach
from bsmon.probes.runtime.fault_guard import FaultGuard
from bsmon.probes.runtime.forward_watch import ForwardWatch
from bsmon.probes.runtime.samples import NominalBatch


def sizes(counts: list[int]) -> tuple[NominalBatch, list[int | None]]:
    nominal = NominalBatch()
    return nominal, [nominal.update(n) for n in counts]


def test_an_epoch_s_short_last_batch_is_not_a_change_nor_a_variation():
    nominal, shown = sizes([32, 32, 8, 32, 32, 8, 32, 8, 32])
    assert shown == [32] * 9
    assert not nominal.varies and nominal.range is None


def test_a_new_size_takes_over_once_two_steps_in_a_row_have_it():
    nominal, shown = sizes([32, 32, 16, 16, 16])
    assert shown == [32, 32, 32, 16, 16] and not nominal.varies


def test_a_count_that_changes_every_step_varies_with_its_range_and_last_value():
    episodes = [26, 40, 13, 77, 10, 500, 31]
    nominal, shown = sizes(episodes)
    assert shown == [26, 26, None, None, None, None, None]  # no one size once it varies
    assert nominal.varies and nominal.last == 31
    assert nominal.range == (min(episodes), max(episodes))


def test_a_varying_count_settles_once_it_holds_for_a_few_steps():
    nominal, shown = sizes([26, 40, 13] + [20] * NominalBatch.SETTLE_AFTER + [20, 5, 20])
    assert shown[-5:] == [None, 20, 20, 20, 20]  # the short one is an epoch's end again
    assert not nominal.varies


def counted(model: nn.Module, *inputs: torch.Tensor) -> tuple[list[int | None], ForwardWatch]:
    """The examples the forward watch counts on each call of ``model``."""
    watch = ForwardWatch(model, FaultGuard(lambda _event: None, lambda: 0))
    seen: list[int | None] = []
    watch.on_root(lambda root_pass, _output: seen.append(root_pass.examples))
    watch.arm()
    watch.hold("test")
    try:
        for x in inputs:
            model(x)
    finally:
        watch.close()
    return seen, watch


class Unsqueezing(nn.Module):
    """Takes a batch of scalars as ``[B]`` and makes it ``[B, 1]`` itself."""

    def __init__(self) -> None:
        super().__init__()
        self.affine = nn.Linear(1, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.affine(x.unsqueeze(-1))


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def test_a_state_of_one_example_s_features_is_one_example():
    seen, watch = counted(mlp(), torch.randn(4), torch.randn(1, 4), torch.randn(6, 4))
    assert seen == [1, 1, 6]
    assert watch.uncounted is None


def test_token_ids_in_one_dimension_are_a_batch_as_the_noise_scale_takes_them():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 2))
    seen, _ = counted(model, torch.tensor([1, 2, 3, 4, 5]))
    assert seen == [5]


@pytest.mark.parametrize(
    "model, x, why",
    [
        (Unsqueezing(), torch.randn(7), "takes neither as a batch nor as one example's features"),
        (nn.Sequential(nn.ReLU()), torch.randn(7), "none of its layers says"),
        (nn.Sequential(nn.Identity()), torch.tensor(3.0), "a single number"),
    ],
    ids=["not-its-features", "no-known-layer", "a-number"],
)
def test_a_one_dimensional_input_the_model_cannot_explain_is_not_counted_and_says_why(
    model, x, why
):
    seen, watch = counted(model, x)
    assert seen == [None]
    assert why in (watch.uncounted or "")
    assert str(list(x.shape)) in (watch.uncounted or "")


def test_a_live_job_whose_episodes_vary_shows_the_last_count_and_the_range():
    """The agent's own reading (what the dashboard shows): the last step's examples and the
    range of the recent ones; the samples are every forward call's."""
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    lengths = [5 + (episode * 7) % 23 for episode in range(40)]
    with attach(model, optimizer, serve=False, record=False, noise_scale=None) as mon:
        for length in lengths:
            outputs = [model(torch.randn(4)).sum() for _ in range(length)]
            optimizer.zero_grad()
            torch.stack(outputs).sum().backward()
            optimizer.step()
            assert mon.flush()
        telemetry = mon.job.telemetry
        assert telemetry.samples == sum(lengths[1:])  # the first step has no count
        assert telemetry.batch_size == lengths[-1]
        recent = lengths[-NominalBatch.VARY_WINDOW :]
        assert telemetry.batch_varies == f"varies {min(recent)}–{max(recent)} per step"
