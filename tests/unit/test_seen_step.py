"""The probe's step under `bsmon run`, rebuilt from one training step seen: where the loss
is (the model's own, or an nn loss module on its output) and when it cannot be replayed."""

from __future__ import annotations

import cloudpickle
import pytest
import torch
from torch import nn

from bsmon.probes.maxbatch import recipe
from bsmon.probes.maxbatch.seen_step import NOT_REPRODUCIBLE, ModelLoss, StepWatch


class TupleLoss(nn.Module):  # nanoGPT-style: (logits, loss) when given targets
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 3)

    def forward(self, x, targets=None):
        logits = self.body(x)
        loss = None if targets is None else nn.functional.cross_entropy(logits, targets)
        return logits, loss


class DictLoss(TupleLoss):  # a Hugging Face-style output with .loss
    def forward(self, x, labels=None):
        logits, loss = super().forward(x, labels)
        return {"logits": logits, "loss": loss}


def see(model, step) -> list:
    seen: list = []
    watch = StepWatch(model, seen.append)
    try:
        for _ in range(2):
            step()
    finally:
        watch.close()
    return seen


def x_and_y(n: int = 6):
    return torch.randn(n, 4), torch.randint(0, 3, (n,))


@pytest.mark.parametrize(
    ("model", "call"),
    [
        (TupleLoss(), lambda m, x, y: m(x, y)[1]),
        (DictLoss(), lambda m, x, y: m(x, labels=y)["loss"]),
    ],
)
def test_a_model_that_computes_its_loss_is_replayed_from_its_inputs(model, call):
    x, y = x_and_y()
    (seen,) = see(model, lambda: call(model, x, y).backward())
    assert seen.why_not is None and seen.size == 6 and seen.loss_fn is None
    step = cloudpickle.loads(cloudpickle.dumps(seen.probe_step))  # as the sidecar gets it
    grown = recipe.tile(seen.batch, 6, 12)
    loss = step(model, grown)
    assert loss.dim() == 0 and torch.allclose(step(model, seen.batch), call(model, x, y))


def test_an_nn_loss_module_on_the_output_is_the_probes_loss_fn():
    model, criterion = nn.Linear(4, 3), nn.CrossEntropyLoss()
    x, y = x_and_y()
    (seen,) = see(model, lambda: criterion(model(x), y).backward())
    assert seen.why_not is None and seen.loss_fn is criterion and seen.probe_step is None
    inputs, target = seen.batch
    assert inputs is x and target is y and seen.size == 6


@pytest.mark.parametrize(
    "loss",
    [
        lambda model, x, y: nn.functional.cross_entropy(model(x), y),  # a functional loss
        lambda model, x, y: nn.CrossEntropyLoss()(model(x).view(-1, 3), y),  # a reshaped output
    ],
)
def test_a_loss_computed_where_bsmon_cannot_replay_it_says_why(loss):
    model = nn.Linear(4, 3)
    x, y = x_and_y()
    (seen,) = see(model, lambda: loss(model, x, y).backward())
    assert seen.why_not == NOT_REPRODUCIBLE and seen.batch is None


def test_evaluation_passes_are_not_the_step_and_the_hook_goes_away():
    model = TupleLoss()
    x, y = x_and_y()
    seen: list = []
    hooks = nn.modules.module._global_forward_hooks
    before = len(hooks)
    watch = StepWatch(model, seen.append)
    assert len(hooks) == before + 1
    with torch.no_grad():
        model(x, y)  # evaluation: not the training step
    assert seen == []
    model(x, y)[1].backward()
    assert len(seen) == 1 and len(hooks) == before  # seen once, then the hook is gone
    watch.close()
    assert len(hooks) == before
    assert ModelLoss(1)(model, ((x, y), {})).dim() == 0
