"""mon.log on a fast loop keeps each name's latest value instead of every call's: the
switch, the reading of each latest value once, a rare name never lost, and the way back."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from bsmon.probes import attach
from bsmon.probes.runtime import hot_path
from bsmon.probes.runtime.inbox import TICK_S, Inbox
from bsmon.probes.runtime.logged import ALL_BELOW, SAMPLE_ABOVE, LoggedIntake

from ..helpers import repeat_until


class JobClock:
    """The clock a job's steps are timed by (the hot path's ``perf_counter``) and its rate of
    logging judged by (the intake's): each reading moves it on by ``per_read``, so that a
    loop is as fast or as slow as the test says, whatever share of the CPU it gets: 160 tiny
    steps took 0.7 s here beside other jobs, no fast loop at all."""

    def __init__(self, per_read: float = 1e-5) -> None:
        self.per_read = per_read
        self.t = time.perf_counter()

    def __call__(self) -> float:
        self.t += self.per_read
        return self.t


@pytest.fixture
def job_clock(monkeypatch: pytest.MonkeyPatch) -> JobClock:
    """Jobs attached in the test run on a ``JobClock``, fast until the test slows it."""
    clock = JobClock()
    monkeypatch.setattr(hot_path, "perf_counter", clock)
    monkeypatch.setattr(LoggedIntake.__init__, "__defaults__", (clock,))
    return clock


def intake_on(inbox: Inbox) -> tuple[LoggedIntake, list[bool]]:
    """An intake whose takes come a tick's period apart, as the agent's ticks do."""
    ticks = iter(range(10_000))
    intake, switched = LoggedIntake(clock=lambda: next(ticks) * TICK_S), []

    def keep_latest(on: bool) -> None:
        switched.append(on)

    intake.keep_latest = keep_latest
    return intake, switched


def test_every_call_is_kept_until_a_tick_brings_too_many():
    inbox = Inbox()
    intake, switched = intake_on(inbox)
    for i in range(SAMPLE_ABOVE):
        inbox.logged.append({"loss": float(i)})
    columns: dict[str, list] = {}
    assert intake.take(inbox, SAMPLE_ABOVE, columns, step=SAMPLE_ABOVE) is None
    assert columns == {"loss": [float(i) for i in range(SAMPLE_ABOVE)]} and switched == []

    for i in range(SAMPLE_ABOVE + 1):
        inbox.logged.append({"loss": float(i)})
    note = intake.take(inbox, SAMPLE_ABOVE + 1, {}, step=200)
    assert switched == [True] and intake.latest_only
    assert note is not None and note.kind == "logging_sampled" and note.step == 200


def test_each_latest_value_is_read_once_and_a_rare_name_is_not_lost():
    inbox = Inbox()
    intake, _ = intake_on(inbox)
    first, second = torch.tensor(1.0), torch.tensor(2.0)
    inbox.latest.update(loss=first, val_loss=0.5)
    columns: dict[str, list] = {}
    intake.take(inbox, 100, columns, step=100)
    assert columns == {"loss": [first], "val_loss": [0.5]}
    columns = {}
    intake.take(inbox, 100, columns, step=200)  # nothing new
    assert columns == {}
    inbox.latest.update(loss=second)
    intake.take(inbox, 100, columns, step=300)
    assert columns == {"loss": [second]}  # val_loss was read once, and stays shown


def test_slow_steps_keep_every_call_again():
    inbox = Inbox()
    intake, switched = intake_on(inbox)
    intake.latest_only = True
    intake.take(inbox, ALL_BELOW, {}, step=1)
    assert switched == []
    intake.take(inbox, ALL_BELOW - 1, {}, step=2)
    assert switched == [False] and not intake.latest_only


def test_a_held_mode_is_judged_no_more():
    """The call-counting benchmark slows the steps it counts (cProfile): it holds the mode
    the job's own speed chose, so that the count does not depend on the machine's load."""
    inbox = Inbox()
    intake, switched = intake_on(inbox)
    intake.hold_mode(latest_only=True)
    assert switched == [True] and intake.latest_only
    intake.take(inbox, 1, {}, step=1)  # a slow tick
    assert switched == [True] and intake.latest_only


def test_a_tick_soon_after_the_last_is_not_a_slow_loop():
    """A flush wakes a tick a moment after the last one, with a few steps in between: the
    rate is judged over at least a tick's period, so that is no reason to keep every call."""
    inbox = Inbox()
    now = [0.0]
    intake, switched = LoggedIntake(clock=lambda: now[0]), []
    intake.keep_latest = switched.append
    intake.latest_only = True
    for _ in range(3):  # a few steps, 10 ms after the last tick: 500 a period
        now[0] += 0.01
        intake.take(inbox, 20, {}, step=1)
    assert switched == [] and intake.latest_only
    now[0] += TICK_S  # then a whole period with few more: slow
    intake.take(inbox, 5, {}, step=2)
    assert switched == [False]


def test_a_loop_fast_from_its_start_keeps_the_latest_values_at_once():
    """The first SAMPLE_ABOVE steps are timed at two step boundaries: a loop faster than
    SAMPLE_ABOVE a tick switches then, not a tick later (a tick's losses held with their
    graphs cost the steps after them), and the next take says so with the rate."""
    inbox = Inbox()
    intake, switched = intake_on(inbox)
    assert intake.early(1, now=10.0) == 1 + SAMPLE_ABOVE and intake.timing_start
    assert intake.early(2, now=10.0002) == 1 + SAMPLE_ABOVE  # a boundary another part asked
    assert switched == []
    assert intake.early(1 + SAMPLE_ABOVE, now=10.01) is None  # SAMPLE_ABOVE steps in 10 ms
    assert switched == [True] and not intake.timing_start
    note = intake.take(inbox, 300, {}, step=200)
    assert note is not None and note.kind == "logging_sampled"
    assert f"logs {round(SAMPLE_ABOVE * TICK_S / 0.01)} values a tick" in note.message


def test_a_loop_slow_from_its_start_keeps_every_call():
    inbox = Inbox()
    intake, switched = intake_on(inbox)
    intake.early(1, now=10.0)
    assert intake.early(1 + SAMPLE_ABOVE, now=10.5) is None  # half SAMPLE_ABOVE a tick
    assert switched == [] and not intake.timing_start
    for i in range(10):
        inbox.logged.append({"loss": float(i)})
    columns: dict[str, list] = {}
    assert intake.take(inbox, 10, columns, step=75) is None
    assert columns == {"loss": [float(i) for i in range(10)]}


def test_in_a_job_the_switch_comes_at_the_timed_step(bsmon_dir, job_clock):
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    with attach(model, optimizer, batch_size=8, serve=False, record=False) as mon:
        modes = []
        for _ in range(SAMPLE_ABOVE + 2):
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
            modes.append(mon.job.telemetry.logged_intake.latest_only)
    # a tiny step: SAMPLE_ABOVE of them in far less than a tick; no tick had to see them first
    assert modes[SAMPLE_ABOVE] and not modes[SAMPLE_ABOVE - 1], modes


def test_a_fast_loop_logs_its_latest_loss_and_says_so(bsmon_dir, job_clock):
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    with attach(model, optimizer, batch_size=8, serve=False, record=False) as mon:

        def step() -> float:
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            mon.log(loss=loss)
            return loss.item()

        mon.log(val_loss=0.25)
        for _ in range(SAMPLE_ABOVE + 1):  # a tick (0.25 s) takes hundreds of these steps
            step()
        assert keeps_latest(mon)
        last = [step() for _ in range(5)][-1]
        assert mon.flush()
        scalars = mon.stats()["scalars"]
        assert scalars["loss"] == last and scalars["val_loss"] == 0.25
        kinds = [event.kind for event in mon.job.telemetry.events]
        assert kinds.count("logging_sampled") == 1


def keeps_latest(mon) -> bool:
    return mon.job.telemetry.logged_intake.latest_only


def test_on_a_fast_loop_log_is_the_dict_update_itself_and_a_method_again_once_slow(
    bsmon_dir, job_clock
):
    """While only the latest values are kept, ``mon.log`` adds no frame of bsmon's to the
    training thread: the instance's attribute is the inbox's ``dict.update``."""
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    with attach(model, optimizer, batch_size=8, serve=False, record=False) as mon:

        def step() -> None:
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            mon.log(loss=loss)

        for _ in range(SAMPLE_ABOVE + 1):
            step()
        assert keeps_latest(mon)
        assert mon.log == mon._inbox.latest.update
        job_clock.per_read = 0.01  # ~10 steps a tick, under ALL_BELOW: every call kept again
        repeat_until(step, lambda: not keeps_latest(mon), 1000, "every call kept again")
        assert mon.log.__func__ is type(mon).log
        assert mon.flush()
        assert mon.stats()["scalars"]["loss"] > 0


def run_with_lean_backward(mon, model, optimizer, steps: int, give=None) -> list[float]:
    """Steps whose losses bsmon takes at backward(), as under ``bsmon run``; ``give``: a
    framework's backward(loss) that calls backward() on a scaled copy (accelerate's way)."""
    original = torch.Tensor.backward
    torch.Tensor.backward = mon.job.record_backward_loss(original)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    values = []
    try:
        for _ in range(steps):
            loss = nn.functional.mse_loss(model(x), y)
            if give is None:
                loss.backward()
            else:
                mon.job.loss_given(loss)
                (loss * give).backward()
            optimizer.step()
            optimizer.zero_grad()
            values.append(loss.item())
    finally:
        torch.Tensor.backward = original
    return values


def test_a_fast_loop_keeps_only_its_latest_loss_at_backward(bsmon_dir, job_clock):
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, optimizer, batch_size=8, serve=False, record=False) as mon:
        run_with_lean_backward(mon, model, optimizer, SAMPLE_ABOVE + 1)
        assert mon.job.telemetry.logged_intake.latest_only
        mon.flush()
        values = run_with_lean_backward(mon, model, optimizer, 50)
        assert not mon._inbox.losses  # a tick's tensors are not held: one, the latest
        assert len(mon._inbox.latest_loss) == 1
        assert mon.flush()
        assert mon.stats()["scalars"]["loss"] == values[-1]


def test_with_a_framework_s_loss_the_latest_tensor_at_backward_is_not_shown(bsmon_dir, job_clock):
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, optimizer, batch_size=8, serve=False, record=False) as mon:
        run_with_lean_backward(mon, model, optimizer, SAMPLE_ABOVE + 1, give=0.001)
        assert mon.job.telemetry.logged_intake.latest_only
        values = run_with_lean_backward(mon, model, optimizer, 50, give=0.001)
        assert mon.flush()
        assert mon.stats()["scalars"]["loss"] == values[-1]  # not a thousandth of it


def test_losses_at_backward_count_like_log_calls():
    """bsmon run logs nothing itself: the tensors backward() was called on are its calls (a
    loop slowed at its start, by the noise scale's warm-up, switches on the tick instead)."""
    inbox = Inbox()
    intake, switched = intake_on(inbox)
    assert intake.take(inbox, SAMPLE_ABOVE, {}, step=100, backwards=SAMPLE_ABOVE) is None
    note = intake.take(inbox, SAMPLE_ABOVE + 1, {}, step=200, backwards=SAMPLE_ABOVE + 1)
    assert switched == [True] and note is not None and note.kind == "logging_sampled"
