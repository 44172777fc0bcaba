"""benchmarks/pernorm_floor.py: the floor that every-step measuring is compared with must
compute the same numbers — checked against per-example gradients taken one example at a time."""

from __future__ import annotations

import pytest
import torch

from ..gpu_check_kit import BENCHMARKS  # noqa: F401  (puts benchmarks/ on the import path)


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_the_floor_computes_the_per_example_norms(name):
    from overhead_kit.models import make_step
    from pernorm_floor import FloorHooks

    model, optimizer, *_ = make_step(name, batch=6)
    inputs, target = _batch(model, name)
    loss_fn = torch.nn.CrossEntropyLoss()
    params = [p for p in model.parameters() if p.requires_grad]
    contributions = []
    for x, y in zip(inputs, target, strict=True):  # ∇(ℓ_i / B): example i's part of ḡ
        loss = loss_fn(model(x[None]), y[None]) / len(target)
        contributions.append(torch.autograd.grad(loss, params))
    expected_sum = sum(sum(g.square().sum() for g in c) for c in contributions)
    expected_total = sum(sum(parts).square().sum() for parts in zip(*contributions, strict=True))

    floor = FloorHooks(model, optimizer)
    loss_fn(model(inputs), target).backward()
    optimizer.step()
    floor.close()
    per_example, total = floor.latest.tolist()
    assert per_example == pytest.approx(float(expected_sum), rel=1e-4)
    assert total == pytest.approx(float(expected_total), rel=1e-4)


def _batch(model: torch.nn.Module, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    shape = (6, 256) if name == "mlp" else (6, 3, 32, 32)
    return torch.randn(shape), torch.randint(0, 10, (6,))
