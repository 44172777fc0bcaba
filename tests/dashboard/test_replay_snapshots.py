"""SVG snapshots of a replay: mid-run (paused) and at the end of a finished run.

Update after a deliberate change with ``pytest --snapshot-update`` and look at the images.
"""

from __future__ import annotations

import pytest

from bsmon.tui.app import BsmonApp
from bsmon.tui.replay import RecordSource, ReplayScreen, load_replay

from ..records import two_phase
from .test_tui_snapshots import ready


def replay(tmp_path, position: float) -> BsmonApp:
    path = two_phase(wobble=0.15).write(tmp_path / "run.jsonl")
    source = RecordSource(load_replay(path), position=position, playing=False)
    return BsmonApp(source, dashboard=ReplayScreen, readonly=True)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_replay_paused_mid_run(snap_compare, tmp_path, size):
    assert snap_compare(replay(tmp_path, 0.6), terminal_size=size, run_before=ready)


def test_replay_at_the_end_of_a_finished_run(snap_compare, tmp_path):
    assert snap_compare(replay(tmp_path, 1.0), terminal_size=(100, 30), run_before=ready)
