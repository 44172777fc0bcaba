"""Replay in Pilot (pause, seek, speed, a killed job's record) and the dashboard's ``e`` export."""

from __future__ import annotations

import json

import msgspec
import pytest

from bsmon.probes.record.format import End, Span, encode_line, header_for
from bsmon.probes.summary.schema import Summary
from bsmon.probes.wire.describe import batch_varies
from bsmon.tui.app import BsmonApp
from bsmon.tui.replay import RecordSource, ReplayScreen, load_replay
from bsmon.tui.session import ConnState
from bsmon.tui.widgets.banner import StateBanner
from bsmon.tui.widgets.batch import size_line

from ..records import START, session, two_phase
from ..scripted import autopilot_reading, messages
from .test_tui_pilot import dashboard_ready, text_of, wait_for


def replay_app(path, **kwargs) -> BsmonApp:
    source = RecordSource(load_replay(path), **kwargs)
    return BsmonApp(source, dashboard=ReplayScreen, readonly=True)


@pytest.fixture
def record(tmp_path):
    return two_phase().write(tmp_path / "run.jsonl")


def position(app) -> float:
    return app.screen.snapshot.replay.position_s


async def test_replay_pauses_seeks_and_shows_the_finished_run(record):
    app = replay_app(record, playing=False)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await dashboard_ready(pilot)
        snap = screen.snapshot
        assert snap.replay.position_s == 0 and not snap.replay.playing
        assert snap.replay.duration_s == pytest.approx(75.0)
        assert "‖ REPLAY" in text_of(app, "#state")
        assert "replay of run.jsonl · 0:00:00 / 0:01:15" in str(
            app.screen.query_one(StateBanner).render()
        )
        assert app.screen.snapshot.latest is None  # nothing had happened at the start

        await pilot.press("right")  # a twentieth of the run
        await wait_for(pilot, lambda: position(app) == pytest.approx(3.75), what="seek forward")
        await wait_for(pilot, lambda: "step 70" in text_of(app, "#job"), what="step 70")

        await pilot.press("end")
        await wait_for(pilot, lambda: app.screen.snapshot.state is ConnState.FINISHED, what="end")
        snap = app.screen.snapshot
        assert snap.latest.step == 1500 and snap.replay.ended == "the job finished (closed)"
        assert "step 1,500" in text_of(app, "#job")
        assert "the job finished (closed)" in str(app.screen.query_one(StateBanner).render())
        assert len(snap.points) == 150 and snap.events[-1].message == "phase at batch 64 ended"

        await pilot.press("left", "left")
        await wait_for(pilot, lambda: position(app) == pytest.approx(67.5), what="seek back")
        snap = app.screen.snapshot
        assert snap.state is ConnState.LIVE and snap.latest.step == 1350
        assert len(snap.points) == 135 and len(snap.events) == 2  # started over, then fed

        await pilot.press("home")
        await wait_for(pilot, lambda: position(app) == 0, what="start")
        assert app.screen.snapshot.points == ()

        await pilot.press(">", ">", "<")  # auto: a 75 s run in 30 s, x2.5; then x5
        await pilot.press("space")
        await wait_for(pilot, lambda: position(app) > 0.5, what="playing")
        assert app.screen.snapshot.replay.playing and app.screen.snapshot.replay.speed == 5.0
        await pilot.press("space")
        await wait_for(pilot, lambda: not app.screen.snapshot.replay.playing, what="paused")
        paused_at = position(app)
        await pilot.pause(0.3)
        assert position(app) == paused_at


async def test_replay_plays_to_the_end_by_itself(record):
    app = replay_app(record, speed=500.0)
    async with app.run_test(size=(80, 24)) as pilot:
        await dashboard_ready(pilot)
        await wait_for(pilot, lambda: app.screen.snapshot.replay.ended is not None, what="the end")
        assert not app.screen.snapshot.replay.playing
        assert app.screen.snapshot.latest.step == 1500


async def test_replay_of_a_killed_jobs_record(tmp_path):
    synthetic = two_phase(complete=False)
    path = synthetic.write(tmp_path / "killed.jsonl", tail=b'{"type":"span","t0":1700')
    app = replay_app(path, position=1.0, playing=False)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await dashboard_ready(pilot)
        snap = screen.snapshot
        assert snap.latest.step == 1500 and snap.state is ConnState.LIVE
        assert "no end: the job was killed" in snap.replay.ended
        assert "killed" in str(app.screen.query_one(StateBanner).render())


async def test_replay_is_read_only_and_its_source_says_so(record):
    app = replay_app(record, playing=False)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await dashboard_ready(pilot)
        assert screen.source.readonly_reason
        caps = screen.snapshot.capabilities
        assert caps and not any(cap.available for cap in caps.values())


def notifications(app) -> list[str]:
    return [n.message for n in app._notifications]


async def export_and_wait(pilot) -> None:
    await dashboard_ready(pilot)
    await pilot.press("e")
    exported = lambda: any("exported" in m for m in notifications(pilot.app))  # noqa: E731
    await wait_for(pilot, exported, what="the export notification")


async def test_e_exports_the_summary_from_the_record_and_a_screenshot(record, tmp_path):
    app = replay_app(record, position=1.0, playing=False)
    app.export_dir = tmp_path / "exports"
    async with app.run_test(size=(100, 30)) as pilot:
        await export_and_wait(pilot)
    (directory,) = (tmp_path / "exports").iterdir()
    assert directory.name.startswith("bsmon-synthetic-")
    assert sorted(p.name for p in directory.iterdir()) == [
        "screen.svg",
        "summary.json",
        "summary.md",
    ]
    (message,) = [m for m in notifications(app) if "exported" in m]
    assert message == (
        f"exported from the record to {directory}/: summary.md, summary.json, screen.svg"
    )
    summary = msgspec.json.decode((directory / "summary.json").read_bytes(), type=Summary)
    assert summary.steps == 1500 and summary.source.kind == "record"
    assert "REPLAY" in (directory / "screen.svg").read_text()


async def test_e_without_a_record_exports_what_the_dashboard_holds(tmp_path):
    from bsmon.tui.sources import ScriptedSource

    script = messages(gpu=True)  # a live session whose hello names no record
    app = BsmonApp(ScriptedSource("resnet-cifar", script, clock=lambda: START + 754.0))
    app.export_dir = tmp_path
    async with app.run_test(size=(100, 30)) as pilot:
        await export_and_wait(pilot)
    (directory,) = tmp_path.iterdir()
    data = json.loads((directory / "summary.json").read_text())
    assert data["source"]["kind"] == "dashboard" and data["steps"] == 3000
    assert data["warnings"][0]["kind"] == "from_dashboard"
    assert "does not write a record" in data["warnings"][0]["message"]
    assert data["devices"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert any("from the dashboard's data" in m for m in notifications(app))


async def test_e_before_any_job_says_there_is_nothing_to_export(tmp_path):
    from bsmon.tui.sources import ScriptedSource

    app = BsmonApp(ScriptedSource("nobody", [], disconnect="no such job"))
    app.export_dir = tmp_path
    async with app.run_test(size=(100, 30)) as pilot:
        await dashboard_ready(pilot)
        await pilot.press("e")
        await wait_for(pilot, lambda: notifications(app), what="a notification")
    assert notifications(app) == ["nothing to export yet: no job on screen"]
    assert list(tmp_path.iterdir()) == []


async def test_e_on_a_running_job_writes_beside_its_record_and_says_it_runs(tmp_path):
    """Never into the current directory (a checkout); and a record with no end yet is a job
    that is running, not one that was killed (the dashboard sees it live)."""
    from bsmon.tui.sources import ScriptedSource

    (tmp_path / "records").mkdir()
    record = two_phase(complete=False).write(tmp_path / "records" / "run.jsonl")
    script = messages(gpu=False)
    hello = script[0]
    script[0] = msgspec.structs.replace(
        hello, session=msgspec.structs.replace(hello.session, record=str(record))
    )
    app = BsmonApp(ScriptedSource("resnet-cifar", script, clock=lambda: START + 754.0))
    async with app.run_test(size=(100, 30)) as pilot:
        await export_and_wait(pilot)
    (directory,) = [p for p in (tmp_path / "records").iterdir() if p.is_dir()]
    assert directory.name.startswith("bsmon-resnet-cifar-")
    data = json.loads((directory / "summary.json").read_text())
    assert data["run"]["running"] is True and data["run"]["complete"] is False
    assert data["warnings"][0]["kind"] == "running"
    assert data["warnings"][0]["message"].startswith("the job is still running: this summary")
    text = (directory / "summary.md").read_text()
    assert "still running when this was exported" in text and "killed" not in text


def with_autopilot(synthetic):
    """``two_phase`` with the autopilot's events: switched on at batch 32, then its change to
    64 where the record's second phase starts, and its claim at the end."""
    from bsmon.probes.wire.protocol import Event

    boundary = synthetic.spans[99].t1
    decision = msgspec.structs.replace(
        autopilot_reading().decisions[0],
        step=1000,
        t=boundary,
        old=32,
        new=64,
        half_batch=64.0,
        target=120,
    )
    on = {"state": "on", "why": None, "start_size": 32}
    synthetic.events += [
        Event(t=START + 1, step=20, kind="autopilot_state", message="autopilot on", data=on),
        Event(
            t=boundary,
            step=1000,
            kind="autopilot",
            message="autopilot: batch 32 → 64",
            data={"decision": msgspec.to_builtins(decision), "claimed_gain": 1.4},
        ),
        Event(  # a damaged line's worth: leaves the reading as it was
            t=boundary + 1, step=1010, kind="autopilot", message="?", data={"decision": 3}
        ),
    ]
    synthetic.events.sort(key=lambda e: e.t)
    return synthetic


async def test_replay_rebuilds_the_autopilots_line_from_its_events(tmp_path):
    path = with_autopilot(two_phase()).write(tmp_path / "auto.jsonl")
    app = replay_app(path, position=0.3, playing=False)  # 22 s in: on, not yet decided
    async with app.run_test(size=(100, 30)) as pilot:
        await dashboard_ready(pilot)
        await wait_for(pilot, lambda: "auto    on" in text_of(app, "#batch"), what="on")
        assert "→" not in text_of(app, "#batch")
        await pilot.press("end")
        await wait_for(pilot, lambda: "→ 120" in text_of(app, "#batch"), what="the decision")
        panel = text_of(app, "#batch")
        assert "auto    on → 120 · 1.40× vs 32" in panel and "B½ 64" in panel
        reading = app.screen.snapshot.latest.autopilot
        assert [(d.old, d.new) for d in reading.decisions] == [(32, 64)]
        await pilot.press("home")  # back to the start: rebuilt from nothing
        await wait_for(pilot, lambda: "auto" not in text_of(app, "#batch"), what="not yet on")


def test_a_replay_is_never_shown_silent_between_its_spans(record):
    """A record's spans come seconds apart; the model would count that as silence."""
    source = RecordSource(load_replay(record), playing=False)
    source._show(source.position)  # fed up to the start
    source.position += 30  # 30 s further, nothing fed
    assert source.model.silent_s() is not None  # the live rule would say silent
    assert source.snapshot().silent_s is None


def test_a_span_whose_size_varied_replays_with_the_agent_s_words(tmp_path):
    span = Span(t0=START, t1=START + 1, step=40, steps=40, samples=600, batch_range=[5, 27])
    path = tmp_path / "varied.jsonl"
    end = End(t=START + 1, reason="closed", step=40, samples=600)
    path.write_bytes(
        b"".join(encode_line(i) for i in (header_for(session(), None, START), span, end))
    )
    source = RecordSource(load_replay(path), playing=False)
    metrics = source._metrics(0, 1.0)
    assert metrics.batch_size is None and metrics.batch_varies == batch_varies([5, 27])
    assert "varies 5–27 per step" in size_line(metrics)


async def test_replay_shows_the_advice_of_each_moment_from_its_events(tmp_path):
    """One answer in replay too (issue 41): the Batch panel's advice line at each moment is the
    last ``advice`` event's; a damaged one leaves it as it was."""
    from bsmon.probes.wire.protocol import Advice, Event

    synthetic = two_phase()
    boundary = synthetic.spans[99].t1
    raise_to_64 = Advice(64, 32, "raise", headline="raise → 64", why="1.21× progress/s")
    stay = Advice(64, 64, "stay", headline="stay at 64", why="2× from 32")
    for t, step, advice in ((START + 1, 20, raise_to_64), (boundary + 1, 1010, stay)):
        data = {"advice": msgspec.to_builtins(advice)}
        synthetic.events.append(Event(t=t, step=step, kind="advice", message="…", data=data))
    synthetic.events.append(  # a damaged line's worth
        Event(t=boundary + 2, step=1020, kind="advice", message="?", data={"advice": 3})
    )
    synthetic.events.sort(key=lambda e: e.t)
    app = replay_app(synthetic.write(tmp_path / "advice.jsonl"), position=0.3, playing=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await dashboard_ready(pilot)
        await wait_for(pilot, lambda: "advice  raise → 64" in text_of(app, "#batch"), what="raise")
        await pilot.press("end")
        await wait_for(pilot, lambda: "advice  stay at 64" in text_of(app, "#batch"), what="stay")
        assert "2× from 32" in text_of(app, "#batch")
