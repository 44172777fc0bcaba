"""Per-example norms of a sample of the examples (probes/noise/sampling.py): once a model is
seen to have sequence or image layers, a measured step takes the norms of a rotating quarter
of each pass's examples, against the whole batch's gradient; exactly the per-sample
gradients' norms of those rows."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bsmon.probes.noise.estimators import Units, components
from bsmon.probes.noise.sampling import SAMPLE_MIN, rows_of, sample_size
from bsmon.probes.noise.step_record import read

from .test_noise_sources import (  # noqa: F401  (_close_watches: an autouse fixture)
    Zoo,
    _close_watches,
    brute_force,
    per_example_source,
    zoo_batch,
)


def test_a_quarter_of_the_examples_at_least_sixteen_and_never_more_than_there_are() -> None:
    assert [sample_size(n) for n in (6, 16, 32, 64, 70, 512)] == [6, 16, 16, 16, 18, 128]
    assert rows_of(12, 3) is None and rows_of(SAMPLE_MIN, 0) is None


@pytest.mark.parametrize("examples", [64, 70])
def test_the_rows_rotate_so_that_every_position_is_taken_equally_often(examples: int) -> None:
    taken = torch.zeros(examples, dtype=torch.long)
    positions = torch.arange(examples)
    for step in range(examples):  # a whole number of turns, whatever the sample's size
        rows = rows_of(examples, step)
        assert rows is not None and rows.count == sample_size(examples)
        picked = rows.take(positions)
        assert len(set(picked.tolist())) == rows.count  # no example twice in one step
        taken[picked] += 1
    assert taken.min() == taken.max() == sample_size(examples)


def names_of(model: nn.Module) -> list[str]:
    return [n for n, _ in model.named_parameters() if n != "extra"]


def test_a_sampled_step_takes_exactly_its_rows_norms_against_the_whole_batch() -> None:
    """The first measured step sees the sequence layers and takes every example; the next
    ones a rotating 18 of 70, wrapping at the end of the batch (the 4th: rows 54–69, 0, 1)."""
    model = Zoo().eval()  # BatchNorm on running statistics: examples independent
    source = per_example_source(model)
    tokens, image, weights = zoo_batch(70)
    names = names_of(model)
    everything, whole = brute_force(model, names, tokens, image, weights)
    for step in range(1, 6):
        model.zero_grad(set_to_none=True)
        (model(tokens, image) * weights).sum().backward()
        record = source.take_record(step)
        total, _scale, sq_sum = read(record.values)
        assert record.examples == 70
        assert total == pytest.approx(whole, rel=1e-4)  # the step's gradient: every example
        if step == 1:
            assert record.units == ((70, 1.0, 1.0),)
            assert sq_sum == pytest.approx(everything, rel=1e-4)
            continue
        rows = rows_of(70, step - 2)
        assert rows is not None and record.units == ((18, 1.0, 1.0),)
        picked = rows.take(torch.arange(70))
        expected, _ = brute_force(model, names, tokens[picked], image[picked], weights[picked])
        assert sq_sum == pytest.approx(expected, rel=1e-4)
        assert "norms of 18 of 70 examples a step" in source.detail()
    assert picked.tolist() == [*range(54, 70), 0, 1]
    source.close()


def test_over_a_turn_the_sampled_estimates_average_to_the_whole_batchs() -> None:
    """Four sampled steps of 16 take each of 64 examples once: their tr Σ estimates average
    to the one from every example (unbiased, not merely close)."""
    model = Zoo().eval()
    source = per_example_source(model)
    tokens, image, weights = zoo_batch(64)

    def estimate(step: int):
        model.zero_grad(set_to_none=True)
        (model(tokens, image) * weights).sum().backward()
        record = source.take_record(step)
        total, _scale, sq_sum = read(record.values)
        ((units, size, _factor),) = record.units
        return components(total, record.examples, [Units(sq_sum, units, size)]), units

    whole, units = estimate(1)
    assert units == 64
    sampled = [estimate(step) for step in range(2, 6)]
    assert {units for _, units in sampled} == {16}
    mean_trace = sum(found.trace for found, _ in sampled) / 4
    assert mean_trace == pytest.approx(whole.trace, rel=1e-4)
    source.close()


def test_plain_two_dimensional_layers_and_training_batch_norm_take_every_example() -> None:
    """Where the norms cost next to nothing (an MLP), or need the whole batch's statistics
    (BatchNorm in training), nothing is sampled."""
    mlp = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1))
    zoo = Zoo().train()
    sources = [per_example_source(mlp), per_example_source(zoo)]
    x = torch.randn(64, 5)
    tokens, image, weights = zoo_batch(64)
    for step in range(1, 4):
        for model in (mlp, zoo):
            model.zero_grad(set_to_none=True)
        mlp(x).square().sum().backward()
        (zoo(tokens, image) * weights).sum().backward()
        for source in sources:
            assert source.take_record(step).units == ((64, 1.0, 1.0),)
    for source in sources:
        assert not source.sampler.on
        source.close()
