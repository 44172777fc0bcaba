"""A live job that sends nothing (stopped, hung, or busy in a long call holding Python's lock)
is shown as silent, with a clock that keeps moving, and as live again when it speaks: a
scripted job on an injected clock, and a real job stopped with SIGSTOP."""

from __future__ import annotations

import os
import signal
import subprocess
import threading

import msgspec
import pytest

from bsmon.probes.wire import protocol
from bsmon.tui.app import BsmonApp
from bsmon.tui.session import SILENT_AFTER_S, ConnState
from bsmon.tui.sources import ScriptedSource, SocketSource, Update
from bsmon.tui.widgets.banner import StateBanner
from workloads.reliability_kit import JobProcess

from ..helpers import wait_until
from ..scripted import NOW, messages
from .test_tui_pilot import dashboard_ready, text_of, wait_for


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def test_a_scripted_job_gone_silent_is_shown_so_and_live_again_when_it_speaks():
    clock = Clock(NOW)
    script = messages()
    source = ScriptedSource("job", script, clock=clock)
    app = BsmonApp(source)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await dashboard_ready(pilot)
        assert "● LIVE" in text_of(app, "#state") and "up 0:12:34" in text_of(app, "#job")
        banner = app.screen.query_one(StateBanner)

        clock.now += SILENT_AFTER_S - 1  # a pause shorter than the threshold: still live
        await pilot.pause(0.1)
        assert "● LIVE" in text_of(app, "#state") and not banner.display

        clock.now += 9  # 12 s without a message
        await wait_for(pilot, lambda: "SILENT 12s" in text_of(app, "#state"), what="silent")
        assert "up 0:12:46" in text_of(app, "#job")  # the clock moves on
        assert banner.display and "the job sends nothing" in str(banner.render())
        assert screen.snapshot.state is ConnState.LIVE  # still connected: keys still work

        clock.now += 1
        await wait_for(pilot, lambda: "SILENT 13s" in text_of(app, "#state"), what="13s")

        latest = script[-1]
        source.push(msgspec.structs.replace(latest, step=latest.step + 50, t=latest.t + 13))
        await wait_for(pilot, lambda: "● LIVE" in text_of(app, "#state"), what="live again")
        assert not banner.display and "step 3,050" in text_of(app, "#job")


@pytest.fixture
def start(processes):
    return lambda args: processes.start(args, stdin=subprocess.PIPE, text=True)


def test_a_real_job_stopped_with_sigstop_is_silent_until_sigcont(bsmon_dir, start):
    job = JobProcess(start, "stopped", "--no-record")
    socket = job.wait_ready()
    source = SocketSource("stopped", lambda: socket)
    updates: list[Update] = []
    reader = threading.Thread(target=source.run, args=(updates.append,), daemon=True)
    reader.start()
    try:

        def latest() -> protocol.Metrics | None:
            return updates[-1].snapshot.latest if updates else None

        wait_until(lambda: (m := latest()) and m.step > 0, timeout=60, message="metrics")
        os.kill(job.process.pid, signal.SIGSTOP)
        try:
            silent = wait_until(
                lambda: updates[-1].snapshot.silent_s, timeout=60, message="silence shown"
            )
            assert silent >= SILENT_AFTER_S
            stopped_at = updates[-1].snapshot.latest.step
            wait_until(
                lambda: (updates[-1].snapshot.silent_s or 0) >= silent + 1,
                timeout=30,
                message="the silence counted on while no message comes",
            )
        finally:
            os.kill(job.process.pid, signal.SIGCONT)
        wait_until(
            lambda: updates[-1].snapshot.silent_s is None and latest().step > stopped_at,
            timeout=60,
            message="live again with new steps after SIGCONT",
        )
        assert updates[-1].snapshot.state is ConnState.LIVE
    finally:
        source.stop()
        reader.join(10)
    job.stop()
