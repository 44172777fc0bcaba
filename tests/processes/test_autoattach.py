"""The pieces behind `bsmon run` and the integrations, in-process: finding the model, counting
samples per step, changes held for an integration's boundary, a script that attaches itself."""

from __future__ import annotations

import copy
import subprocess
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bsmon.probes import attach
from bsmon.probes.batch.control import BatchController
from bsmon.probes.batch.policy import BatchPolicy
from bsmon.probes.launch.autoattach import AutoAttach, find_model
from bsmon.probes.runtime import loader_watch
from bsmon.probes.runtime.distributed import StepSync
from bsmon.probes.runtime.fault_guard import FaultGuard
from bsmon.probes.wire import protocol

from ..helpers import ROOT


class Wrapper(nn.Module):
    """Stands in for DDP / torch.compile: holds the model as a child."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module


def test_the_outermost_module_holding_the_optimizer_parameters_is_found():
    net = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))
    wrapped = Wrapper(net)
    ema = copy.deepcopy(net)  # an EMA copy: other parameters, same shape
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    assert find_model(optimizer) is wrapped
    assert find_model(torch.optim.SGD(ema.parameters(), lr=0.1)) is ema
    head = nn.Linear(4, 2)
    teacher_and_student = Wrapper(nn.ModuleList([nn.Linear(100, 100), head]))
    assert find_model(torch.optim.SGD(head.parameters(), lr=0.1)) is teacher_and_student
    loose = nn.Parameter(torch.zeros(3))
    assert find_model(torch.optim.SGD([loose], lr=0.1)) is None
    del wrapped, teacher_and_student


def test_training_batches_are_counted_with_their_loaders_batch_size(bsmon_dir):
    """Batches drawn before bsmon run attaches count toward the first step; the monitor
    counts the later ones; evaluation batches count toward none."""
    agent = AutoAttach("t")
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train = DataLoader(TensorDataset(torch.zeros(21, 3)), batch_size=8)  # 8, 8, 5
    validation = DataLoader(TensorDataset(torch.zeros(32, 3)), batch_size=16)
    assert loader_watch.subscribe(agent._on_batch) is None
    try:
        with torch.no_grad():
            list(validation)  # a sanity check before training: gradients off
        batches = iter(train)
        for (x,) in (next(batches), next(batches)):  # two micro-batches
            model(x).sum().backward()
        agent._pre_step(optimizer, (), {})  # the first step's pre-hook: bsmon attaches
        optimizer.step()
        model.eval()
        list(validation)  # evaluation: the model in eval() mode
        model.train()
        (x,) = next(batches)  # the epoch's short last batch
        model(x).sum().backward()
        optimizer.step()
        mon = agent.monitor
        assert mon.flush()
        assert mon.job.telemetry.samples == 8 + 8 + 5
        assert mon.job.telemetry.batch_size == 8  # the loader's, not the short batch's
    finally:
        loader_watch.unsubscribe(agent._on_batch)
        if agent.monitor is not None:
            agent.monitor.close()


def test_the_samples_of_a_step_set_the_batch_size_of_a_job_without_control(bsmon_dir):
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sizes = []
    with attach(model, optimizer, name="counted") as mon:
        # an epoch's short last batch (3), then a change the job keeps (4, 4)
        for first, total in [(8, 16), (8, 8), (3, 3), (8, 8), (4, 4), (4, 4)]:
            mon.job.count_samples(total, first)
            model(torch.randn(2, 2)).sum().backward()
            optimizer.step()
            assert mon.flush()
            sizes.append(mon.job.telemetry.batch_size)
        assert mon.job.telemetry.samples == 16 + 8 + 3 + 8 + 4 + 4
        assert mon.batch_size is None  # no control: the observed size is telemetry only
    assert sizes == [8, 8, 8, 8, 8, 4]


def controller(sync=None, rank: int = 0) -> tuple[BatchController, list]:
    switched: list[protocol.BatchChange] = []
    step = [0]
    ctl = BatchController(
        initial=8,
        policy=BatchPolicy(),
        micro_batch_size=None,
        optimizer=torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1),
        lr_scaling=None,
        scheduler=None,
        emit=lambda _event: None,
        record=switched.append,
        guard=FaultGuard(lambda _event: None, lambda: 0),
        step=lambda: step[0],
        noise_scale=lambda: None,
        sync=sync,
        rank=rank,
    )
    ctl.defer_to("at the end of the epoch")
    return ctl, switched


def test_a_held_change_waits_for_apply_deferred_and_says_where():
    ctl, switched = controller()
    result = ctl.request(16, confirm=True, reason="r", source="monitor")
    assert result == {"old": 8, "new": 16, "step": 0, "applies_at": "at the end of the epoch"}
    for _ in range(5):
        ctl.at_step_boundary()
    assert ctl.size == 8 and not switched
    reading = ctl.reading()
    assert reading.pending == 16 and reading.applies_at == "at the end of the epoch"
    assert ctl.request_step("up", confirm=True, source="monitor")["new"] == 32  # from 16
    ctl.apply_deferred()
    assert ctl.size == 32 and [(c.old, c.new) for c in switched] == [(8, 32)]
    assert ctl.reading().pending is None
    ctl.apply_deferred()  # nothing held: nothing happens
    assert len(switched) == 1


class FakeSync:
    """Rank 0's broadcast without a process group: what rank 0 sends at exchange k, every
    rank receives at exchange k + 1 (as distributed.StepSync does)."""

    every = 2

    def __init__(self, channel: list[int], rank: int) -> None:
        self.channel = channel  # rank 0's proposal at each exchange
        self.rank = rank
        self.boundaries = 0
        self.exchanges = 0

    def due(self, _step: int) -> bool:  # each call a step of its own (the test's step stays)
        self.boundaries += 1
        return self.boundaries % self.every == 0

    def exchange(self, proposal: int) -> int:
        k = self.exchanges
        self.exchanges += 1
        if self.rank == 0:
            self.channel.append(proposal)
        return self.channel[k - 1] if k else 0


def test_in_a_multi_rank_job_only_the_agreed_change_is_applied_at_the_boundary():
    channel: list[int] = []
    rank0, switched0 = controller(FakeSync(channel, 0), rank=0)
    rank1, switched1 = controller(FakeSync(channel, 1), rank=1)
    rank0.request(16, confirm=True, reason="r", source="monitor")
    rank0.apply_deferred()  # not agreed yet: rank 1 could not apply it, so rank 0 does not
    assert rank0.size == 8
    for _ in range(2):  # the first exchange sends it ...
        for ctl in (rank0, rank1):
            ctl.at_step_boundary()
    assert rank1.reading().pending is None
    for _ in range(2):  # ... the second delivers it to every rank
        for ctl in (rank0, rank1):
            ctl.at_step_boundary()
    assert rank0.size == rank1.size == 8  # agreed, held for the epoch end
    assert rank0.reading().pending == rank1.reading().pending == 16
    for ctl in (rank0, rank1):
        ctl.apply_deferred()
    assert rank0.size == rank1.size == 16
    assert len(switched0) == len(switched1) == 1


def test_a_multi_rank_controller_asks_for_the_slow_path_only_at_its_exchanges_steps():
    """The steps between two exchanges are ordinary ones (they were all boundaries: every
    part of the slow path asked on every step of a multi-rank job); a boundary a rank asked
    for on its own (a sampled step, say) does not exchange, so the ranks stay in step."""
    sync = StepSync(group=None, rank=1)  # type: ignore[arg-type]  (exchange replaced below)
    exchanged: list[int] = []
    sync.exchange = lambda proposal: exchanged.append(proposal) or 0  # type: ignore[method-assign]
    ctl, _ = controller(sync, rank=1)
    assert [ctl.at_boundary(step, 0.0) for step in (1, 5, 7, 8, 13)] == [8, 8, 8, 16, 16]
    assert exchanged == [0]  # at the end of step 8 only


def test_a_policy_minimum_can_say_why():
    policy = BatchPolicy(min_size=8, min_reason="the Trainer fixed it")
    assert policy.refusal(4) == "4 is below the minimum batch size 8 (the Trainer fixed it)"


def test_bsmon_run_leaves_a_script_that_attaches_itself_to_do_so(bsmon_dir):
    script = (
        "import torch\n"
        "from bsmon.probes import attach\n"
        "from bsmon.probes.launch import autoattach\n"
        "from bsmon.probes.agent import live_monitors\n"
        "m = torch.nn.Linear(2, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "with attach(m, o, batch_size=4, name='own'):\n"
        "    for _ in range(3):\n"
        "        m(torch.randn(4, 2)).sum().backward(); o.step()\n"
        "    print(len(list(live_monitors())), autoattach.installed().stood_down)\n"
    )
    command = [sys.executable, "-m", "bsmon.tui.cli", "run", "--headless", "--"]
    result = subprocess.run(
        [*command, sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert (
        result.stdout.strip() == "1 the script attaches bsmon itself; bsmon run leaves it to that"
    )


def test_once_attached_bsmon_run_costs_one_append_at_backward_and_still_sees_a_second_optimizer(
    bsmon_dir,
):
    agent = AutoAttach("lean")
    original_backward = torch.Tensor.backward
    model, critic = nn.Linear(3, 1), nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    other = torch.optim.SGD(critic.parameters(), lr=0.01)
    agent.install()
    hooked_steps = 0
    try:
        for step in range(60):
            hooked_steps += agent._hook is not None
            loss = model(torch.ones(4, 3)).pow(2).mean()
            loss.backward()
            optimizer.step()
            critic(torch.ones(4, 3)).sum().backward()
            other.step()
            if step == 0:  # attached at the first step: the wrappers are the lean ones now
                assert torch.Tensor.backward not in (agent._backward, original_backward)
        mon = agent.monitor
        assert mon.flush()
        # the loss shown is the last scalar backward() ran on (the critic's, here)
        last_critic = critic(torch.ones(4, 3)).sum().item()
        assert abs(mon.stats()["scalars"]["loss"] - last_critic) < 0.05 * abs(last_critic) + 1e-3
        notes = [e.message for e in mon.job.telemetry.events if "another optimizer" in e.message]
        assert len(notes) == 1  # seen by the monitor's global post-step hook, said once
        assert mon.step == 60  # a step each time the first optimizer steps
        # the global pre-step hook only until the first step boundary after the attach
        assert 1 <= hooked_steps <= 2
    finally:
        agent.uninstall()
    assert torch.Tensor.backward is original_backward
