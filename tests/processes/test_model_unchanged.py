"""The model stays the user's: with bsmon attached — between steps and in the middle of a
measured step — the model and the optimizer pickle, deep-copy, save and load exactly as
without it, and close() leaves no hook anywhere."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from torch import nn

from bsmon.probes import attach

from ..unit.test_noise_sources import TinyGPT

# torch.save of a whole model walks torch.jit, which warns that it is deprecated
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")


def global_hooks() -> dict[str, dict]:
    module = nn.modules.module
    return {
        name: dict(getattr(module, name))
        for name in (
            "_global_forward_hooks",
            "_global_forward_pre_hooks",
            "_global_backward_hooks",
            "_global_backward_pre_hooks",
        )
    }


def module_hooks(model: nn.Module) -> list[dict]:
    return [
        table
        for m in model.modules()
        for table in (m._forward_hooks, m._forward_pre_hooks, m._backward_hooks)
        if table
    ]


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> torch.Tensor:
    idx = torch.randint(0, 13, (4, 6))
    out = model(idx)
    loss = nn.functional.cross_entropy(out.reshape(-1, 13), idx.reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss


def copies_and_pickles(model: nn.Module, optimizer: torch.optim.Optimizer) -> bytes:
    """Every way a job copies or saves its model, checked; the model's pickle returned."""
    twin = copy.deepcopy(model)
    assert all(
        torch.equal(a, b) for a, b in zip(twin.parameters(), model.parameters(), strict=True)
    )
    assert not module_hooks(twin)
    buffer = io.BytesIO()
    torch.save({"model": model, "optimizer": optimizer}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert type(loaded["model"]) is type(model) and not module_hooks(loaded["model"])
    fresh = type(model)()
    fresh.load_state_dict(model.state_dict())
    assert all(
        torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters(), strict=True)
    )
    copy.deepcopy(optimizer)
    pickle.loads(pickle.dumps(optimizer.state_dict()))
    data = pickle.dumps(model)
    assert b"bsmon" not in data
    return data


@pytest.mark.parametrize("mode", ["per_example", "microbatch", "sequential"])
def test_the_model_copies_and_pickles_as_without_bsmon(mode, bsmon_dir):
    torch.manual_seed(0)
    model = TinyGPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = global_hooks()
    with attach(model, optimizer, noise_scale=mode, noise_budget=None) as mon:
        for _ in range(3):
            train_step(model, optimizer)
        between_steps = copies_and_pickles(model, optimizer)
        # in the middle of a measured step: after the forward pass, before backward
        out = model(torch.randint(0, 13, (4, 6)))
        assert mon._noise.source.measuring
        during = copies_and_pickles(model, optimizer)
        out.sum().backward()
        optimizer.zero_grad()
        assert mon.stats()["errors"] == 0
    assert during == between_steps  # nothing of bsmon's in the model, even mid-step
    assert pickle.dumps(model) == between_steps
    assert global_hooks() == before and not module_hooks(model)


def test_a_compiled_model_passed_to_attach_is_watched_through_its_wrapper_only(bsmon_dir):
    """The wrapper torch.compile returns pickles without its hooks; nothing is registered on
    the modules dynamo traces, and no global hook is ever registered for it."""
    model = nn.Linear(4, 1)
    wrapper = torch.compile(model)  # compiles at its first call, which never comes here
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = global_hooks()
    with attach(wrapper, optimizer, record=False) as mon:
        mon._watch.arm()
        mon._watch.hold("test")
        assert global_hooks() == before and not module_hooks(model)
        assert wrapper._forward_hooks  # the wrapper's own, left out of its pickle
        assert b"bsmon" not in pickle.dumps(wrapper._orig_mod)
        assert "compiled" in mon._noise.why or "compile" in mon._noise.why
    assert not wrapper._forward_hooks


def test_close_after_every_part_has_hooked_in_leaves_nothing_behind(bsmon_dir, monkeypatch):
    """The order close() detaches the parts in (the noise scale's sources let go of the
    forward watch before it closes; the accounting stops listening to loaders and modes):
    after a run where each has hooked in — every step measured and timed, a DataLoader,
    an evaluation pass — no hook, subscriber or thread of bsmon's is left."""
    from bsmon.probes.anatomy.sampling import STRIDE_VARIABLE
    from bsmon.probes.runtime import loader_watch, mode_watch

    monkeypatch.setenv(STRIDE_VARIABLE, "1")
    torch.manual_seed(0)
    model = TinyGPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = global_hooks()
    data = torch.utils.data.DataLoader(torch.randint(0, 13, (32, 6)), batch_size=4)
    with attach(model, optimizer, noise_budget=None) as mon:
        for idx in data:
            out = model(idx)
            nn.functional.cross_entropy(out.reshape(-1, 13), idx.reshape(-1)).backward()
            optimizer.step()
            optimizer.zero_grad()
        model.eval()
        with torch.no_grad():
            model(torch.randint(0, 13, (4, 6)))
        model.train()
        assert mon.flush() and mon.stats()["errors"] == 0
        assert loader_watch._watch._subscribers and mode_watch._watch._subscribers
    assert global_hooks() == before and not module_hooks(model)
    assert not any(p._backward_hooks or p._post_accumulate_grad_hooks for p in model.parameters())
    assert not any(m._backward_pre_hooks for m in model.modules())
    assert not loader_watch._watch._subscribers and not mode_watch._watch._subscribers
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks
