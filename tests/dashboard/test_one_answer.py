"""One answer to "which batch size?" (issue 41), on every surface at once: a real training
job (its own thread, attached with bsmon) and the dashboard on its socket, driven by keys
through a change, the autopilot on and off, a probe, and a divergence that recovers; at each
moment the Batch panel, the Noise panel, the probe screen, the events, ``mon.stats()`` and in
the end the summary name the same size, or say why one of them is deliberately different
(B_simple's own verdict, which counts steps alone)."""

from __future__ import annotations

import json
import threading
import time

import torch
from torch import nn

from bsmon.probes import attach
from bsmon.probes.demo import make_dataset
from bsmon.tui.app import BsmonApp, follow_job
from bsmon.tui.probe_screen import ProbeScreen

from ..helpers import wait_until
from .test_tui_pilot import dashboard_ready, text_of, wait_for

STEP_S = 0.004  # the job's own compute beside the model's: windows of tens of steps


class Job:
    """The user's loop: a small classifier on generated images, ``mon.log(loss=...)`` every
    step. After ``knock_at`` becomes the batch size, its 10th step there knocks the weights
    (a bad step, as a too-large change can give) and, while ``stuck`` is set, every step after
    lands back there (so the test reads the surfaces while the loss is up, however fast the
    machine); then training brings the loss back. ``hold`` pauses it between steps (an
    evaluation, say)."""

    def __init__(self, bsmon_dir) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Flatten(), nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 10))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.data = make_dataset(8192)  # the demo's: B_simple resolves in a few hundred steps
        self.mon = attach(
            self.model,
            self.optimizer,
            batch_size=32,
            name="one-answer",
            loss_fn=nn.CrossEntropyLoss(),
            socket_dir=bsmon_dir,
            record=True,
        )
        self.stop, self.hold = threading.Event(), threading.Event()
        self.knock_at: int | None = None
        self.knocked_at: int | None = None
        self.stuck = threading.Event()
        self.knocked: list[torch.Tensor] = []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        mon, at = self.mon, 0
        while not self.stop.is_set():
            for x, y in mon.dataloader(self.data, shuffle=True):
                while self.hold.is_set() and not self.stop.is_set():
                    time.sleep(0.01)
                if self.stop.is_set():
                    return
                loss = nn.functional.cross_entropy(self.model(x), y)
                loss.backward()
                self.optimizer.step()
                self.optimizer.zero_grad()
                mon.log(loss=loss)
                at = at + 1 if mon.batch_size == self.knock_at else 0
                if at == 10 and self.knocked_at is None:
                    self.knocked_at = mon.step
                    with torch.no_grad():
                        for p in self.model.parameters():
                            p.add_(torch.randn_like(p) * 0.3)
                    self.knocked = [p.detach().clone() for p in self.model.parameters()]
                elif self.knocked and self.stuck.is_set():
                    with torch.no_grad():
                        for p, knocked in zip(self.model.parameters(), self.knocked, strict=True):
                            p.copy_(knocked)
                time.sleep(STEP_S)

    def advice(self) -> dict:
        return self.mon.stats()["advice"] or {}


def flat(text: str) -> str:
    """A panel's text as one line (wrapped lines joined at their spaces)."""
    return " ".join(text.split())


async def surfaces_agree(pilot, job: Job, what: str) -> dict:
    """Wait until the Batch panel, the Noise panel and ``mon.stats()`` name the same answer
    at one moment (each redraw follows the job's latest window), and return it."""
    app = pilot.app
    now: dict = {}

    def agree() -> bool:
        now.update(job.advice())
        headline = now.get("headline")
        noise = flat(text_of(app, "#noise-text"))
        return bool(headline) and (
            f"advice {headline} {now['why']}" in flat(text_of(app, "#batch"))
            and f"advice: {headline}" in noise
        )

    try:
        await wait_for(pilot, agree, timeout=120, what=f"one answer on every panel ({what})")
    except AssertionError as exc:
        seen = f"batch: {flat(text_of(app, '#batch'))}\nnoise: {flat(text_of(app, '#noise-text'))}"
        raise AssertionError(f"{exc}; the agent: {now}\n{seen}") from None
    return dict(now)


async def test_every_surface_speaks_for_the_one_advisor(bsmon_dir):
    job = Job(bsmon_dir)
    job.thread.start()
    app = BsmonApp(follow_job(job.mon.socket_path, "one-answer", bsmon_dir))
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await dashboard_ready(pilot)
            first = await surfaces_agree(pilot, job, "at the start")
            assert first["current"] == 32

            await pilot.press("plus")  # a key: 32 → 64, within 2× of 32 that trained well
            await wait_for(pilot, lambda: job.mon.batch_size == 64, what="batch 64")
            after_key = await surfaces_agree(pilot, job, "after +")
            assert after_key["current"] == 64

            await pilot.press("a")  # the autopilot acts on the advice, or says what holds it
            await wait_for(
                pilot,
                lambda: job.mon.job.autopilot_reading().state == "on",
                what="the autopilot on",
            )
            start = job.mon.step
            await wait_for(pilot, lambda: job.mon.step > start + 300, what="300 steps", timeout=120)
            reading = job.mon.job.autopilot_reading()
            advice = job.advice()
            for decision in reading.decisions:  # each change it made was the advice then
                assert decision.predicted_gain > 1.05 and decision.kind in ("grow", "shrink")
            if reading.held is not None:  # holding: the advice's rule, not one of its own
                assert advice["action"] in ("stay", "wait")
            await pilot.press("a")
            await wait_for(
                pilot, lambda: job.mon.job.autopilot_reading().state == "off", what="off"
            )
            await surfaces_agree(pilot, job, "autopilot off")

            job.hold.set()  # the probe's recommendation is the advice: the same answer
            await wait_for(pilot, lambda: not job.mon.job.batch_control.upcoming, what="idle")
            await pilot.press("p")
            await pilot.press("y")
            await wait_for(pilot, lambda: isinstance(app.screen, ProbeScreen), what="the probe")
            prober = job.mon.job.prober
            await wait_for(
                pilot,
                lambda: not prober.running and prober.reading().result is not None,
                timeout=240,
                what="the probe's result",
            )
            result = prober.reading().result
            assert result.status == "ok", result.error
            recommendation, advice = result.recommendation, job.advice()
            assert recommendation.batch_size == advice["batch_size"]
            assert recommendation.reasons[: len(advice["reasons"])] == advice["reasons"]
            await wait_for(
                pilot,
                lambda: "recommend" in text_of(app, "#recommendation"),
                what="the recommendation on the probe screen",
            )
            shown = flat(text_of(app, "#recommendation"))
            assert f"{recommendation.batch_size:,}" in shown
            assert flat(recommendation.reasons[0])[:60] in shown  # its first reason, first
            await pilot.press("escape")
            job.hold.clear()

            size, resumed = job.mon.batch_size, job.mon.step
            control = job.mon.job.batch_control
            await wait_for(  # the loss's level before the change, and a size that trained well
                pilot,
                lambda: job.mon.step > resumed + 100 and control.watch.trained_well == size,
                timeout=120,
                what=f"{size} trained well",
            )
            job.knock_at = size * 2  # the next key, then a bad step at that size
            job.stuck.set()
            await pilot.press("plus")
            await wait_for(pilot, lambda: job.mon.batch_size == size * 2, what="the change")
            try:
                await wait_for(
                    pilot, lambda: job.advice().get("action") == "back", timeout=120, what="back"
                )
            except AssertionError as exc:
                raise AssertionError(
                    f"{exc}: knocked at {job.knocked_at}, {control.watch.latest}, {job.advice()}"
                ) from None
            back = await surfaces_agree(pilot, job, "after the divergence")
            assert back["action"] == "back" and back["batch_size"] == size
            assert back["reasons"][0].startswith(f"the loss diverged after batch {size} →")
            job.stuck.clear()  # training brings the loss back
            await wait_for(
                pilot,
                lambda: job.advice().get("action") not in ("back", None),
                timeout=240,
                what="the loss recovered",
            )
            await wait_for(
                pilot, lambda: "recovered" in text_of(app, "#batch"), what="recovered, shown"
            )
            recovered = await surfaces_agree(pilot, job, "after the recovery")
            assert recovered["current"] == size * 2
    finally:
        job.stop.set()
        job.thread.join(timeout=60)
        last = job.advice()
        job.mon.close()

    events = job.mon.job.telemetry.events
    advice_events = [e for e in events if e.kind == "advice"]
    assert any(e.data["advice"]["action"] == "back" for e in advice_events)  # said at once
    assert advice_events[-1].data.get("final")
    final = advice_events[-1].data["advice"]
    assert (final["batch_size"], final["action"]) == (last["batch_size"], last["action"])
    record = job.mon.session.record
    summary_path = wait_until(
        lambda: next(iter(sorted((bsmon_dir / "records").glob("*summary*.json"))), None),
        timeout=60,
        message=f"the summary beside {record}",
    )
    summary = json.loads(summary_path.read_text())
    assert summary["final_word"]["advice"]["batch_size"] == last["batch_size"]
    notes = " ".join(n["message"] for n in summary["recommendations"])
    assert "restore a checkpoint" not in notes  # the loss came back: no stale alarm
    assert any(w["kind"] == "loss_recovered" for w in summary["warnings"])
