"""mon.log on a fast loop keeps each name's latest value instead of every call's: the
switch, the reading of each latest value once, a rare name never lost, and the way back."""

from __future__ import annotations

import time

import torch
from torch import nn

from bsmon.probes import attach
from bsmon.probes.runtime.inbox import Inbox
from bsmon.probes.runtime.logged import ALL_BELOW, SAMPLE_ABOVE, LoggedIntake


def intake_on(inbox: Inbox) -> tuple[LoggedIntake, list[bool]]:
    intake, switched = LoggedIntake(), []

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


def test_a_fast_loop_logs_its_latest_loss_and_says_so(bsmon_dir):
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
        deadline = time.monotonic() + 20
        while not mon.telemetry.logged_intake.latest_only and time.monotonic() < deadline:
            for _ in range(SAMPLE_ABOVE):  # a tick of ~0.1 s takes hundreds of these steps
                step()
        assert mon.telemetry.logged_intake.latest_only
        last = [step() for _ in range(5)][-1]
        assert mon.flush()
        scalars = mon.stats()["scalars"]
        assert scalars["loss"] == last and scalars["val_loss"] == 0.25
        kinds = [event.kind for event in mon.telemetry.events]
        assert kinds.count("logging_sampled") == 1
