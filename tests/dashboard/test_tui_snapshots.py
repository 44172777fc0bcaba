"""SVG snapshots of the dashboard in its states and at two terminal sizes.

Update them after a deliberate change with ``pytest --snapshot-update`` and look at the
result (screenshots/ has PNGs made from real sessions).
"""

from __future__ import annotations

import pytest

from ..scripted import scripted_app
from .test_tui_pilot import dashboard_ready

SIZES = [(80, 24), (120, 40)]


async def ready(pilot) -> None:
    await dashboard_ready(pilot)
    await pilot.pause(0.2)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_live_with_gpu(snap_compare, size):
    assert snap_compare(scripted_app(gpu=True), terminal_size=size, run_before=ready)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_live_without_gpu(snap_compare, size):
    assert snap_compare(scripted_app(gpu=False), terminal_size=size, run_before=ready)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_autopilot_on(snap_compare, size):
    assert snap_compare(scripted_app(autopilot=True), terminal_size=size, run_before=ready)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_disconnected(snap_compare, size):
    app = scripted_app(disconnect="the job closed the connection")
    assert snap_compare(app, terminal_size=size, run_before=ready)


def test_help_screen(snap_compare):
    async def open_help(pilot):
        await ready(pilot)
        await pilot.press("question_mark")
        await pilot.pause(0.2)

    assert snap_compare(scripted_app(), terminal_size=(100, 30), run_before=open_help)
