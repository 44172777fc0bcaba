"""Evaluation inside the training loop is time of its own (probes/runtime/evaluation.py), and
each step's samples come from the best source there is (probes/runtime/samples.py)."""

from __future__ import annotations

import random

import pytest

from bsmon.probes.runtime.evaluation import EvalClock
from bsmon.probes.runtime.samples import NOT_COUNTED, StepSamples, StepTally


def test_no_evaluation_no_time_taken():
    clock = EvalClock(0.0)
    clock.train(0.5)
    assert clock.take(1.0) == 0.0 and clock.spans == 0


def test_an_evaluation_pass_runs_from_where_training_paused_to_its_last_batch():
    clock = EvalClock(0.0)
    clock.take(1.0)  # step 1 ends at t=1
    for t in (1.5, 2.0, 4.0):  # the validation loader's batches (the last: its end)
        clock.evaluate(t)
    clock.train(4.2)  # the next training batch
    assert clock.take(5.0) == pytest.approx(3.0)  # 1.0 → 4.0
    assert clock.spans == 1
    assert clock.take(6.0) == 0.0  # the next step has none


def test_a_training_batch_drawn_before_the_evaluation_moves_its_start():
    clock = EvalClock(0.0)
    clock.take(1.0)
    clock.train(1.4)  # a prefetched training batch, then validation
    clock.evaluate(2.0)
    clock.evaluate(3.0)
    assert clock.take(3.5) == pytest.approx(1.6)


def test_two_evaluation_spans_in_one_step_window_add_up_without_the_training_between():
    clock = EvalClock(0.0)
    clock.evaluate(1.0)  # 0 → 1
    clock.train(2.0)
    clock.evaluate(2.5)  # 2 → 2.5
    assert clock.take(3.0) == pytest.approx(1.5) and clock.spans == 2


def test_evaluation_never_reaches_past_the_step_end():
    clock = EvalClock(0.0)
    clock.evaluate(5.0)
    assert clock.take(2.0) == pytest.approx(2.0)


class Steps:
    """The training thread's counts handed to the agent thread's tally, as the hot path does."""

    def __init__(self):
        self.samples, self.tally = StepSamples(), StepTally()

    def end_step(self, model_examples, declared):
        drawn, first = self.samples.take() if self.samples.drawing else (0, 0)
        return self.tally.resolve(drawn, first, model_examples, declared or 0)


def test_the_jobs_own_count_wins_over_loaders_and_the_model():
    steps = Steps()
    samples = steps.samples
    samples.count(16, 8)
    samples.draw(16, 8)  # the same batches, seen again through the DataLoader
    assert steps.end_step(model_examples=0, declared=None) == (16, 8)


def test_loader_batches_then_the_models_inputs_then_the_declared_size():
    steps = Steps()
    assert steps.end_step(model_examples=0, declared=None) == (None, None)  # unknown, not 0
    assert steps.end_step(model_examples=12, declared=None) == (12, 12)
    assert steps.end_step(model_examples=0, declared=64) == (64, 64)
    samples = steps.samples
    samples.draw(8, 8)
    samples.draw(8, 8)
    assert steps.end_step(model_examples=99, declared=None) == (16, 12)  # 8 twice to take over


def test_once_a_loader_says_the_samples_a_step_without_a_batch_trained_none_new():
    """A loader that fetches ahead drew the step's batch in the step before."""
    steps = Steps()
    steps.samples.draw(8, 8)
    assert steps.end_step(model_examples=NOT_COUNTED, declared=None) == (8, 8)
    assert steps.end_step(model_examples=NOT_COUNTED, declared=None) == (0, 8)
    assert steps.end_step(model_examples=NOT_COUNTED, declared=64) == (0, 64)


def test_a_short_last_batch_is_not_a_new_batch_size_but_a_kept_change_is():
    steps = Steps()
    samples = steps.samples
    sizes = []
    for drawn in (32, 32, 4, 32, 16, 16):
        samples.draw(drawn, None)
        sizes.append(steps.end_step(model_examples=0, declared=None)[1])
    assert sizes == [32, 32, 32, 32, 32, 16]


def test_the_loaders_own_batch_size_is_the_jobs():
    steps = Steps()
    samples = steps.samples
    samples.draw(4, 32)  # the epoch's short last batch of a loader built with batch_size=32
    assert steps.end_step(model_examples=0, declared=None) == (4, 32)


@pytest.mark.parametrize("seed", range(6))
def test_a_ticks_steps_resolved_together_are_resolved_as_one_by_one(seed):
    """``resolve_all`` skips the steps of a run of equal inputs once the tally stops changing:
    the same samples and sizes as resolving each step, on runs long and short (a model
    counted then steady, loader batches with a short last one, a declared size that
    changes, loaders that fetch ahead)."""
    rng = random.Random(seed)
    inputs = []
    for _ in range(40):
        drawn = rng.choice([0, 0, 8, 32, 4])
        first = rng.choice([0, drawn, 32]) if drawn else 0
        examples = rng.choice([NOT_COUNTED, 0, 12, 12, 7])
        declared = rng.choice([0, 0, 0, 16, 64])
        inputs += [(drawn, first, examples, declared)] * rng.choice([1, 2, 3, 40, 90])
    one_by_one, together = StepTally(), StepTally()
    expected = [one_by_one.resolve(*step) for step in inputs]
    samples, sizes = together.resolve_all(*zip(*inputs, strict=True))
    assert list(zip(samples, sizes, strict=True)) == expected
    assert together._state() == one_by_one._state()
