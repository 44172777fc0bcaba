"""What an Adam-type optimizer carries across a batch change (probes/batch/adam_rules.py):
each rule moves what it names, by its formula, in place, and says so; the others stay."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from bsmon.probes.batch.adam_rules import AdamRules, carry_over


def trained(optimizer_class: type, **kwargs: object) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A model whose optimizer has taken three steps (so it has moments)."""
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    optimizer = optimizer_class(model.parameters(), lr=0.01, **kwargs)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()
    return model, optimizer


def only(**chosen: str) -> AdamRules:
    """The rules ``chosen``, and every other kept."""
    return AdamRules(**{"moments": "keep", "beta2": "keep", "weight_decay": "keep", **chosen})


def moments(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [
        state[name].clone()
        for state in optimizer.state.values()
        for name in ("exp_avg", "exp_avg_sq", "step")
    ]


def test_by_default_only_beta2_moves():
    assert AdamRules() == only(beta2="examples")


def test_keeping_everything_moves_nothing_and_says_nothing():
    _, optimizer = trained(torch.optim.AdamW, weight_decay=0.1)
    before = moments(optimizer)
    keep = only(beta2="keep")
    said = carry_over(optimizer, keep, 64, 128, lr_factor=math.sqrt(2), noise_scale=50.0)
    assert said == []
    assert optimizer.param_groups[0]["betas"] == (0.9, 0.999)
    assert optimizer.param_groups[0]["weight_decay"] == 0.1
    assert all(torch.equal(a, b) for a, b in zip(before, moments(optimizer), strict=True))


def test_beta2_keeps_its_half_life_in_examples_and_a_change_back_restores_it():
    _, optimizer = trained(torch.optim.AdamW)
    rules = only(beta2="examples")
    said = carry_over(optimizer, rules, 64, 256, lr_factor=2.0, noise_scale=None)
    beta1, beta2 = optimizer.param_groups[0]["betas"]
    assert beta1 == 0.9
    assert beta2 == pytest.approx(0.999**4)
    half_life_examples = lambda b2, batch: batch * math.log(0.5) / math.log(b2)  # noqa: E731
    assert half_life_examples(beta2, 256) == pytest.approx(half_life_examples(0.999, 64))
    assert said == ["β2 0.999 → 0.996 (half-life kept in examples)"]
    carry_over(optimizer, rules, 256, 64, lr_factor=0.5, noise_scale=None)
    assert optimizer.param_groups[0]["betas"][1] == pytest.approx(0.999)


def test_a_tensor_beta2_moves_in_place():
    model = nn.Linear(2, 1)
    beta2 = torch.tensor(0.99)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, betas=(torch.tensor(0.9), beta2))
    carry_over(optimizer, only(beta2="examples"), 32, 64, lr_factor=None, noise_scale=None)
    assert optimizer.param_groups[0]["betas"][1] is beta2
    assert float(beta2) == pytest.approx(0.99**2)


def test_decoupled_weight_decay_keeps_its_timescale_in_examples():
    _, optimizer = trained(torch.optim.AdamW, weight_decay=0.1)
    factor = math.sqrt(4)  # the square-root rule's, 64 → 256
    said = carry_over(
        optimizer, only(weight_decay="timescale"), 64, 256, lr_factor=factor, noise_scale=None
    )
    decay = optimizer.param_groups[0]["weight_decay"]
    assert decay == pytest.approx(0.2)
    lr0, lr1 = 0.01, 0.01 * factor
    assert 256 / (lr1 * decay) == pytest.approx(64 / (lr0 * 0.1))  # τ = B/(η·λ), in examples
    assert said == ["weight decay 0.1 → 0.2 (timescale kept in examples)"]


def test_an_l2_decay_and_a_group_without_decay_stay():
    _, adam = trained(torch.optim.Adam, weight_decay=0.1)  # L2: part of the gradient
    assert (
        carry_over(adam, only(weight_decay="timescale"), 8, 16, lr_factor=1.4, noise_scale=None)
        == []
    )
    assert adam.param_groups[0]["weight_decay"] == 0.1
    _, adamw = trained(torch.optim.AdamW, weight_decay=0.0)
    assert (
        carry_over(adamw, only(weight_decay="timescale"), 8, 16, lr_factor=1.4, noise_scale=None)
        == []
    )


def test_reset_moments_make_the_next_step_a_fresh_optimizers_first():
    model, optimizer = trained(torch.optim.AdamW, weight_decay=0.0)
    said = carry_over(optimizer, only(moments="reset"), 16, 32, lr_factor=None, noise_scale=None)
    assert said == ["moments reset (2 tensors' averages start again)"]
    assert all(not t.any() for t in moments(optimizer))
    twin = nn.Linear(4, 3)
    twin.load_state_dict(model.state_dict())
    fresh = torch.optim.AdamW(twin.parameters(), lr=0.01, weight_decay=0.0)
    inputs = torch.randn(8, 4)
    for net, opt in ((model, optimizer), (twin, fresh)):
        opt.zero_grad()
        net(inputs).pow(2).mean().backward()
        opt.step()
    for mine, theirs in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.allclose(mine, theirs)


def test_rescaled_second_moments_follow_the_noise_at_the_new_batch():
    _, optimizer = trained(torch.optim.Adam)
    before = [(s["exp_avg"].clone(), s["exp_avg_sq"].clone()) for s in optimizer.state.values()]
    said = carry_over(optimizer, only(moments="rescale"), 16, 64, lr_factor=2.0, noise_scale=48.0)
    factor = (1 + 48 / 64) / (1 + 48 / 16)
    assert said == [f"second moments × {factor:.3g} (the noise at B_simple 48)"]
    for (avg, avg_sq), state in zip(before, optimizer.state.values(), strict=True):
        assert torch.equal(state["exp_avg"], avg)
        assert torch.allclose(state["exp_avg_sq"], avg_sq * factor)


def test_rescaling_without_a_noise_scale_keeps_the_moments_and_says_why():
    _, optimizer = trained(torch.optim.Adam)
    before = moments(optimizer)
    said = carry_over(optimizer, only(moments="rescale"), 16, 64, lr_factor=2.0, noise_scale=None)
    assert said == ["moments kept (no B_simple to rescale them by yet)"]
    assert all(torch.equal(a, b) for a, b in zip(before, moments(optimizer), strict=True))


def test_sgd_has_nothing_these_rules_move():
    _, sgd = trained(torch.optim.SGD, momentum=0.9, weight_decay=0.1)
    rules = only(moments="reset", beta2="examples", weight_decay="timescale")
    assert carry_over(sgd, rules, 16, 32, lr_factor=2.0, noise_scale=10.0) == []
    assert all(s["momentum_buffer"].any() for s in sgd.state.values())
    assert sgd.param_groups[0]["weight_decay"] == 0.1


@pytest.mark.parametrize(
    ("field", "value"), [("moments", "zero"), ("beta2", "steps"), ("weight_decay", 2)]
)
def test_a_rule_that_does_not_exist_is_a_clear_error(field, value):
    with pytest.raises(ValueError, match=f"adam_{field} must be one of"):
        AdamRules(**{field: value})


def controller(optimizer: torch.optim.Optimizer, rules: AdamRules, *, synced: bool) -> tuple:
    from bsmon.probes.batch.control import BatchController
    from bsmon.probes.batch.policy import BatchPolicy
    from bsmon.probes.runtime.fault_guard import FaultGuard

    events: list = []
    ctl = BatchController(
        initial=16,
        policy=BatchPolicy(),
        micro_batch_size=None,
        optimizer=optimizer,
        lr_scaling="auto",
        scheduler=None,
        emit=events.append,
        record=lambda _change: None,
        guard=FaultGuard(lambda _event: None, lambda: 0),
        step=lambda: 3,
        noise_scale=lambda: 48.0,
        adam_rules=rules,
    )
    ctl.synced = synced  # as a multi-rank job's controller is
    return ctl, events


@pytest.mark.parametrize("synced", [False, True])
def test_a_multi_rank_job_keeps_its_moments_rather_than_rescale_them_by_one_ranks_estimate(synced):
    from bsmon.probes.batch.control import Pending

    _, optimizer = trained(torch.optim.Adam)
    before = moments(optimizer)
    ctl, events = controller(optimizer, only(moments="rescale"), synced=synced)
    ctl.switch(Pending(64, "step up", "monitor"))
    (event,) = events
    kept = all(torch.equal(a, b) for a, b in zip(before, moments(optimizer), strict=True))
    assert kept is synced
    if synced:
        assert event.message.endswith(
            "; moments kept (rescaling them by one rank's B_simple would part the ranks)"
        )
    else:
        assert "; second moments × 0.438 (the noise at B_simple 48)" in event.message
