"""The refresh interval: --interval, the [ ] keys, and panels drawn at the interval."""

from __future__ import annotations

import time

from bsmon.tui.cli.parser import build_parser, main
from bsmon.tui.messages import SnapshotArrived
from bsmon.tui.settings import next_interval, settings
from bsmon.tui.sources import Update

from ..scripted import scripted_app
from .test_tui_pilot import dashboard_ready, wait_for


def test_interval_option_on_the_dashboard_commands(capsys):
    for argv in (
        ["--interval", "2", "demo"],
        ["demo", "--interval", "2"],
        ["attach", "x", "--interval", "2"],
    ):
        assert build_parser().parse_args(argv).interval == 2.0
    assert main(["--interval", "0", "list"]) == 2
    assert "--interval" in capsys.readouterr().err
    assert next_interval(1.0, 1) == 2.0 and next_interval(1.0, -1) == 0.5
    assert next_interval(10.0, 1) == 10.0 and next_interval(0.25, -1) == 0.25


async def test_brackets_change_the_interval_and_say_so(monkeypatch):
    monkeypatch.setattr(settings, "interval_s", 1.0)
    app = scripted_app()
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await dashboard_ready(pilot)
        await pilot.press("right_square_bracket")
        assert screen.interval == 2.0
        await wait_for(
            pilot,
            lambda: any("redraws every 2 s" in str(n.message) for n in app._notifications),
            what="toast",
        )
        await pilot.press("left_square_bracket", "left_square_bracket")
        assert screen.interval == 0.5 and settings.interval_s == 0.5


async def test_snapshots_are_drawn_at_the_interval_not_on_every_message(monkeypatch):
    monkeypatch.setattr(settings, "interval_s", 0.5)
    app = scripted_app()
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await dashboard_ready(pilot)
        drawn: list[float] = []
        original = screen.show_snapshot
        monkeypatch.setattr(
            screen, "show_snapshot", lambda snap: (drawn.append(time.monotonic()), original(snap))
        )
        snap = screen.snapshot
        for _ in range(20):  # 20 updates in 1 s, as a fast job sends them
            screen.post_message(SnapshotArrived(Update(snap)))
            await pilot.pause(0.05)
        await pilot.pause(0.6)
        assert 1 <= len(drawn) <= 4, drawn  # about one per 0.5 s, not 20
