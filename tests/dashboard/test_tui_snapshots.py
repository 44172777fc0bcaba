"""SVG snapshots of the dashboard in its states and at two terminal sizes.

Update them after a deliberate change with ``pytest --snapshot-update`` and look at the
result (screenshots/ has PNGs made from real sessions).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bsmon.probes.wire import protocol
from bsmon.tui.app import BsmonApp
from bsmon.tui.settings import settings
from bsmon.tui.sources import ScriptedSource

from ..scripted import CPU_MFU_NOTE, NOW, messages, scripted_app, with_throughput
from .test_tui_pilot import dashboard_ready, text_of, wait_for
from .test_tui_ranks import distributed_messages
from .test_tui_silent import Clock

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


SEQUENCE_MODEL = {  # the Batch panel's tokens line: on a GPU with MFU; on a CPU with its reason
    "gpu-80x24": (True, (80, 24), protocol.ThroughputReading(tokens_per_s=1_052_000.0, mfu=0.412)),
    "cpu-120x40": (
        False,
        (120, 40),
        protocol.ThroughputReading(tokens_per_s=48_300.0, mfu_note=CPU_MFU_NOTE),
    ),
}


@pytest.mark.parametrize("case", SEQUENCE_MODEL)
def test_a_sequence_model_s_tokens_and_mfu(snap_compare, case):
    gpu, size, reading = SEQUENCE_MODEL[case]
    script = with_throughput(messages(gpu=gpu), reading)
    app = BsmonApp(ScriptedSource("gpt-small", script, clock=lambda: NOW))
    assert snap_compare(app, terminal_size=size, run_before=ready)


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


def test_no_job_running(snap_compare):
    app = BsmonApp(directory=Path("/nonexistent/bsmon-1000"))  # no jobs: the no-job screen
    assert snap_compare(app, terminal_size=(80, 24))


def test_bsmon_run_with_ranks_at_80x24(snap_compare, monkeypatch):
    """The footer (d Detach last) and the header (rank and pid) whole at 80 columns."""
    monkeypatch.setattr(settings, "mode", "run")
    app = BsmonApp(ScriptedSource("resnet-cifar", distributed_messages(), clock=lambda: NOW))
    assert snap_compare(app, terminal_size=(80, 24), run_before=ready)


def test_silent_job(snap_compare):
    clock = Clock(NOW)
    app = BsmonApp(ScriptedSource("resnet-cifar", messages(gpu=False), clock=clock))

    async def go_silent(pilot):
        await ready(pilot)
        clock.now += 12
        await wait_for(pilot, lambda: "SILENT 12s" in text_of(pilot.app, "#state"), what="12s")
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=(80, 24), run_before=go_silent)
