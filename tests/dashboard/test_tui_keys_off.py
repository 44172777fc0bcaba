"""A key that cannot act says why when pressed (a toast), and `p` is greyed with its reason
when the job's probe cannot run (no loss_fn): scripted jobs and a real one."""

from __future__ import annotations

import asyncio

import torch

from bsmon.probes.wire import protocol
from bsmon.tui.app import BsmonApp
from bsmon.tui.confirm import ConfirmScreen
from bsmon.tui.disabled import NOT_DISTRIBUTED
from bsmon.tui.sources import ScriptedSource

from ..scripted import NOW, messages, scripted_app
from .test_tui_pilot import dashboard_ready, real_job_app, text_of, wait_for
from .test_tui_zero import PROBE_REASON, REASON, zero_code_script

LOSS_FN = "the probe needs attach(..., loss_fn=...)"


def toasts(app) -> list[str]:
    return [str(n.message) for n in app._notifications]


async def test_keys_off_under_bsmon_run_say_why_when_pressed():
    app = BsmonApp(ScriptedSource("job", zero_code_script(), clock=lambda: NOW))
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await dashboard_ready(pilot)
        for key, reason in (("plus", REASON), ("minus", REASON), ("p", PROBE_REASON)):
            await pilot.press(key)
            await wait_for(pilot, lambda r=reason: any(r in t for t in toasts(app)), what=key)
        assert not isinstance(app.screen, ConfirmScreen)  # p asked nothing
        assert screen.check_action("probe", ()) is None  # greyed


async def test_plus_on_a_finished_job_and_r_on_one_process_say_why():
    app = scripted_app(finished=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await dashboard_ready(pilot)
        await pilot.press("plus")
        await wait_for(
            pilot,
            lambda: any("+/- is off: the job has finished" in t for t in toasts(app)),
            what="finished toast",
        )
        await pilot.press("r")
        await wait_for(pilot, lambda: any(NOT_DISTRIBUTED in t for t in toasts(app)), what="r")


async def test_a_probe_that_cannot_run_is_greyed_with_the_jobs_reason():
    script = messages()
    script[-1].probe = protocol.ProbeReading(blocked=LOSS_FN + " or attach(..., probe_step=...)")
    app = BsmonApp(ScriptedSource("job", script, clock=lambda: NOW))
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await dashboard_ready(pilot)
        assert screen.check_action("probe", ()) is None
        assert "p off — ? says why" in " ".join(text_of(app, "#batch").split())
        await pilot.press("p")
        await wait_for(pilot, lambda: any(LOSS_FN in t for t in toasts(app)), what="toast")
        assert not isinstance(app.screen, ConfirmScreen)


async def test_a_real_job_without_loss_fn_reports_why_its_probe_cannot_run(bsmon_dir):
    job, mon, app = real_job_app("no-loss-fn", bsmon_dir)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            screen = await dashboard_ready(pilot)
            mon.set_probe_batch((torch.randn(8, job.features), torch.zeros(8)))
            for _ in range(5):
                job.step(mon)
            await asyncio.to_thread(mon.flush)

            def blocked() -> str | None:
                latest = screen.snapshot.latest
                return latest.probe.blocked if latest is not None else None

            await wait_for(pilot, lambda: LOSS_FN in (blocked() or ""), what="blocked reading")
            assert screen.check_action("probe", ()) is None
            await pilot.press("p")
            await wait_for(pilot, lambda: any(LOSS_FN in t for t in toasts(app)), what="toast")
    finally:
        mon.close()
