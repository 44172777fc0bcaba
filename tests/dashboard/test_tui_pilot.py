"""The dashboard driven by Pilot, fed by scripted sessions and by a real job."""

from __future__ import annotations

import asyncio
import time

import msgspec
from textual.widgets import Markdown, OptionList

from bsmon.probes import attach
from bsmon.tui.app import BsmonApp, follow_job
from bsmon.tui.disabled import JOBS_OFF
from bsmon.tui.help import HelpScreen
from bsmon.tui.job_screens import NoJobsScreen, PickerScreen
from bsmon.tui.screens import DashboardScreen
from bsmon.tui.session import ConnState
from bsmon.tui.widgets.banner import StateBanner
from bsmon.tui.widgets.devices import allocator_line

from .. import scripted
from ..jobs import TinyJob
from ..scripted import scripted_app


async def wait_for(pilot, condition, timeout: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


def text_of(app, selector: str) -> str:
    return str(app.screen.query_one(selector).render())


async def dashboard_ready(pilot) -> DashboardScreen:
    await wait_for(
        pilot,
        lambda: (
            isinstance(pilot.app.screen, DashboardScreen) and pilot.app.screen.snapshot is not None
        ),
        what="first snapshot",
    )
    await pilot.pause()
    return pilot.app.screen


async def test_live_dashboard_shows_the_jobs_numbers():
    app = scripted_app(gpu=True)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await dashboard_ready(pilot)
        assert screen.snapshot.state is ConnState.LIVE
        header = text_of(app, "#job")
        assert "resnet-cifar" in header and "gpu-box-7" in header and "pid 4242" in header
        assert "up 0:12:34" in header and "step 3,000" in header
        devices = text_of(app, "#devices")
        assert "NVIDIA H100" in devices and "93%" in devices and "67°C" in devices
        assert "512 W" in devices and "/79.6 GiB" in devices
        batch = text_of(app, "#batch")
        assert "128" in batch and "samples/s" in batch
        assert "B_simple ≈ 1.32k ± 41" in text_of(app, "#noise-text")
        assert not app.screen.query_one(StateBanner).display


async def test_the_allocators_peak_reserved_share_and_its_retries_fit_the_devices_panel(
    monkeypatch,
):
    """A healthy job's panel is as it was; one whose allocator retries and ran out of memory
    shows the counts with the peak reserved share, in the panel's width at 80 columns."""
    app = scripted.scripted_app(gpu=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await dashboard_ready(pilot)
        devices = text_of(app, "#devices")
        assert "rsvd" not in devices and "retr" not in devices
    (healthy,) = scripted.gpu_devices()
    near_full = msgspec.structs.replace(
        healthy, torch_reserved_peak_bytes=int(77.6 * 2**30), alloc_retries=12, ooms=1
    )
    monkeypatch.setattr(scripted, "gpu_devices", lambda: [near_full])
    app = scripted.scripted_app(gpu=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await dashboard_ready(pilot)
        panel = app.screen.query_one("#devices")
        devices = text_of(app, "#devices")
        assert "rsvd pk 97% · 12 retries · 1 OOM" in devices
        assert max(map(len, devices.splitlines())) <= panel.content_size.width
    wide = allocator_line(msgspec.structs.replace(near_full, ooms=0), 60)
    assert wide == "rsvd peak 77.6 GiB ([$error]97%[/]) · [$warning]12 retries[/]"


async def test_a_throttled_gpu_says_why_and_at_what_clock_in_the_devices_panel(monkeypatch):
    (healthy,) = scripted.gpu_devices()
    held = msgspec.structs.replace(healthy, throttled="power cap", sm_clock_mhz=1410.0)
    monkeypatch.setattr(scripted, "gpu_devices", lambda: [held])
    app = scripted.scripted_app(gpu=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await dashboard_ready(pilot)
        devices = text_of(app, "#devices")
        assert "throttled: power cap · 1410 MHz" in devices
        panel = app.screen.query_one("#devices")
        assert max(map(len, devices.splitlines())) <= panel.content_size.width


async def test_no_gpu_state_says_why():
    app = scripted_app(gpu=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await dashboard_ready(pilot)
        devices = text_of(app, "#devices")
        assert "n/a — torch 2.13.0+cpu is a CPU-only build" in devices
        assert "CPU  187%" in devices


async def test_disconnected_state_keeps_the_last_data_under_a_banner():
    app = scripted_app(disconnect="the job closed the connection")
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await dashboard_ready(pilot)
        assert screen.snapshot.state is ConnState.DISCONNECTED
        banner = app.screen.query_one(StateBanner)
        assert banner.display and "disconnected" in str(banner.render())
        assert "DISCONNECTED" in text_of(app, "#state")
        assert "step 3,000" in text_of(app, "#job")  # last data kept


async def test_finished_state():
    app = scripted_app(finished=True)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await dashboard_ready(pilot)
        assert screen.snapshot.state is ConnState.FINISHED
        assert "the job finished" in str(app.screen.query_one(StateBanner).render())


async def test_help_opens_and_closes_with_question_mark():
    app = scripted_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await dashboard_ready(pilot)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert "Panels" in app.screen.query_one(Markdown).source
        await pilot.press("escape")
        assert isinstance(app.screen, DashboardScreen)


async def test_q_quits():
    app = scripted_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await dashboard_ready(pilot)
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0


async def test_events_are_listed_with_their_time_into_the_run():
    app = scripted_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await dashboard_ready(pilot)
        log = app.screen.query_one("#events")
        text = " ".join(" ".join(line.text for line in log.lines).split())  # undo the wrapping
        assert "0:00:00 step 0 • bsmon attached to resnet-cifar" in text
        assert "0:06:40 step 1600 ▲ grad_norm is inf at step 1600" in text


def real_job_app(name: str, bsmon_dir) -> tuple[TinyJob, object, BsmonApp]:
    """A tiny job attached as ``name`` and a dashboard that follows it."""
    job = TinyJob()
    mon = attach(job.model, job.optimizer, batch_size=8, name=name)
    return job, mon, BsmonApp(follow_job(mon.socket_path, name, bsmon_dir))


async def test_a_real_job_live_then_finished(bsmon_dir):
    job, mon, app = real_job_app("pilot-live", bsmon_dir)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            screen = await dashboard_ready(pilot)
            for _ in range(40):
                job.step(mon)
            await asyncio.to_thread(mon.flush)
            await wait_for(
                pilot,
                lambda: screen.snapshot.latest is not None and screen.snapshot.latest.step == 40,
                what="step 40 on screen",
            )
            await wait_for(pilot, lambda: "step 40" in text_of(app, "#job"), what="header")
            await asyncio.to_thread(mon.close)
            await wait_for(
                pilot, lambda: screen.snapshot.state is ConnState.FINISHED, what="finished state"
            )
    finally:
        mon.close()


async def test_no_jobs_screen_then_attaches_when_a_job_appears(bsmon_dir):
    app = BsmonApp(directory=bsmon_dir)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, NoJobsScreen), what="no-jobs screen")
        assert "bsmon demo" in app.screen.query_one(Markdown).source
        assert "bsmon run -- python train.py" in app.screen.query_one(Markdown).source
        job = TinyJob()
        mon = attach(job.model, job.optimizer, batch_size=8, name="late")
        try:
            screen = await dashboard_ready(pilot)
            await wait_for(pilot, lambda: screen.snapshot.session is not None, what="hello")
            assert screen.snapshot.session.name == "late"
        finally:
            mon.close()


async def test_several_jobs_open_a_picker_and_enter_attaches(bsmon_dir):
    jobs = [TinyJob(seed=i) for i in range(2)]
    mons = [attach(j.model, j.optimizer, batch_size=8, name=f"job{i}") for i, j in enumerate(jobs)]
    try:
        assert mons[0].socket_path != mons[1].socket_path
        app = BsmonApp(directory=bsmon_dir)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, PickerScreen), what="picker")
            options = app.screen.query_one(OptionList)
            assert options.option_count == 2
            labels = [str(options.get_option_at_index(i).prompt) for i in range(2)]
            assert any("job0" in label for label in labels) and any(
                "job1" in label for label in labels
            )
            options.highlighted = next(i for i, label in enumerate(labels) if "job1" in label)
            await pilot.press("enter")
            screen = await dashboard_ready(pilot)
            await wait_for(pilot, lambda: screen.snapshot.session is not None, what="hello")
            assert screen.snapshot.session.name == "job1"
    finally:
        for mon in mons:
            mon.close()


async def test_j_goes_back_from_a_picked_job_to_the_picker_and_on_to_another(bsmon_dir):
    jobs = [TinyJob(seed=i) for i in range(2)]
    mons = [attach(j.model, j.optimizer, batch_size=8, name=f"job{i}") for i, j in enumerate(jobs)]
    try:
        app = BsmonApp(directory=bsmon_dir)
        async with app.run_test(size=(100, 30)) as pilot:
            for name in ("job1", "job0"):
                await wait_for(pilot, lambda: isinstance(app.screen, PickerScreen), what="picker")
                options = app.screen.query_one(OptionList)
                labels = [str(options.get_option_at_index(i).prompt) for i in range(2)]
                options.highlighted = next(i for i, label in enumerate(labels) if name in label)
                await pilot.press("enter")
                screen = await dashboard_ready(pilot)
                await wait_for(pilot, lambda s=screen: s.snapshot.session is not None, what="hello")
                assert screen.snapshot.session.name == name
                assert screen.active_bindings["j"].binding.description == "Jobs"  # in the footer
                await pilot.press("j")
            await wait_for(pilot, lambda: isinstance(app.screen, PickerScreen), what="picker again")
            assert not any(isinstance(s, DashboardScreen) for s in app.screen_stack)
    finally:
        for mon in mons:
            mon.close()


async def test_j_without_a_picker_says_why():
    app = scripted_app()
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await dashboard_ready(pilot)
        await pilot.press("j")
        await wait_for(
            pilot,
            lambda: any(JOBS_OFF in str(n.message) for n in app._notifications),
            what="j says why",
        )
        assert app.screen is screen and "j" not in screen.active_bindings  # not in the footer
        assert "back to the job picker" in HelpScreen().text()


async def test_no_color_renders_in_grays_only(monkeypatch):
    import re

    monkeypatch.setenv("NO_COLOR", "1")
    app = scripted_app(gpu=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await dashboard_ready(pilot)
        svg = app.export_screenshot()
    assert app.no_color
    window_buttons = {"ff5f57", "febc2e", "28c840"}  # the SVG's window chrome, not the app
    colors = set(re.findall(r"#([0-9a-fA-F]{6})\b", svg)) - window_buttons
    assert colors
    for color in colors:
        r, g, b = (int(color[i : i + 2], 16) for i in (0, 2, 4))
        assert max(r, g, b) - min(r, g, b) <= 4, f"#{color} is not a gray"


async def test_event_lines_are_wrapped_again_when_the_panel_narrows():
    app = scripted_app(gpu=True)
    async with app.run_test(size=(160, 50)) as pilot:
        await dashboard_ready(pilot)
        log = app.screen.query_one("#events")
        await wait_for(pilot, lambda: len(log.lines) > 0, what="events")
        wide = max(strip.cell_length for strip in log.lines)
        await pilot.resize_terminal(80, 24)
        await wait_for(pilot, lambda: log.size.width < wide, what="a narrower panel")
        await pilot.pause(0.2)
        assert log.lines and all(
            s.cell_length <= log.scrollable_content_region.width for s in log.lines
        )
