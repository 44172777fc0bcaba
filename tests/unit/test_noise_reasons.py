"""Reasons worded for whoever reads them: a script's author (attach()) or a bsmon run user."""

from __future__ import annotations

import pytest
from torch import nn

from bsmon.probes.noise import reasons
from bsmon.probes.runtime import audience


@pytest.fixture
def zero_code():
    audience.set_zero_code(True)
    yield
    audience.set_zero_code(False)


def test_a_script_author_is_told_what_to_pass_to_attach():
    said = reasons.not_ddp(2, nn.Linear(2, 2))
    assert "this rank's model (Linear) is not DistributedDataParallel and holds none" in said
    assert "each rank training on its own" in said  # not only "pass a DDP model"
    assert said.endswith("if DDP wraps the model, pass the wrapped model to attach()")
    assert "noise_scale='microbatch'" in reasons.no_layers()
    assert "attach()" in audience.examples_unknown()


def test_a_bsmon_run_user_is_never_told_to_change_an_attach_call(zero_code):
    for said in (
        reasons.not_ddp(2, nn.Linear(2, 2)),
        reasons.comm_hook_taken(),
        reasons.no_layers(),
        audience.examples_unknown(),
    ):
        assert "attach(" not in said and "noise_scale=" not in said, said
    assert reasons.not_ddp(4, None).endswith("the noise scale is off")
