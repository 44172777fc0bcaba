"""The noise-scale panel: its words (``describe``), its fit to the terminal, and the chart,
driven by scripted sessions and by a real job."""

from __future__ import annotations

import asyncio

import torch

from bsmon.probes import attach
from bsmon.probes.wire import protocol
from bsmon.probes.wire.client import JobConnection
from bsmon.probes.wire.protocol import Capability, NoiseScaleReading
from bsmon.tui.app import BsmonApp, follow_job
from bsmon.tui.sources import ScriptedSource
from bsmon.tui.widgets.noise import NoiseChart, describe, fit, log_ticks
from workloads.noise_jobs import ISO, Regression

from .. import scripted
from ..helpers import wait_until
from ..scripted import NOW, messages, scripted_app
from ..watch import metrics_until
from .test_tui_pilot import dashboard_ready, text_of, wait_for

ON = Capability(True, "per-example gradient norms")


def words(reading, batch=128, capability=ON, compact=False, advice=None) -> str:
    lines = describe(reading, capability, batch, compact, advice=advice)
    return " | ".join(line.text for line in lines)


def test_the_meaning_follows_the_batch_against_b_simple():
    reading = NoiseScaleReading(b_simple=1200.0, stderr=40.0, estimator="per_example")
    small = words(reading, batch=128)
    assert "B_simple ≈ 1.2k ± 40" in small
    assert "at batch 128 a step is worth ≈10% of a noiseless step" in small
    assert "raising the batch toward 1.2k cuts steps with little loss of sample" in small
    assert "McCandlish et al. 2018" in small and "order-of-magnitude" in small
    assert "steps ×10, samples ×1.1 of their minimum" in small
    near = words(reading, batch=1024)
    assert "worth ≈46%" in near and "near B_simple" in near
    large = words(reading, batch=8192)
    assert "worth ≈87%" in large and "far above B_simple: a larger one wastes compute" in large
    assert words(reading, batch=128, compact=True).count("|") < small.count("|")
    assert "B=128 step worth ≈10% · raise B" in words(reading, batch=128, compact=True)


def test_with_the_advisors_answer_the_panel_says_it_beside_what_b_simple_says_of_steps():
    """One answer (issue 41): the demo's Noise panel said "raise B" while the autopilot shrank
    the batch. The panel now shows the advisor's answer; B_simple's verdict stays, said to
    count steps alone, as the one surface that is deliberately about something narrower."""
    reading = NoiseScaleReading(b_simple=1200.0, stderr=40.0, estimator="per_example")
    stay = scripted.advice()
    full = words(reading, batch=128, advice=stay)
    assert "raise B counting steps alone · advice: stay at 128 (192 may not fit)" in full
    assert "raising the batch toward" not in full  # no verdict of its own
    compact = words(reading, batch=128, compact=True, advice=stay)
    assert "B=128 step worth ≈10% · advice: stay at 128" in compact


def test_no_number_before_there_is_one():
    collecting = NoiseScaleReading(estimator="per_example", samples=12, needed=30, effective=12)
    text = words(collecting)
    assert "collecting 12/30 steps" in text and "≈" not in text
    bound = NoiseScaleReading(estimator="microbatch", lower_bound=5300.0, samples=80)
    text = words(bound)
    assert "B_simple > 5.3k (lower bound)" in text and "worth ≤2%" in text
    assert "estimate: micro-batches" in text
    assert "raising the batch toward 5.3k" in text


def test_a_lower_bound_under_the_batch_gives_no_advice_yet():
    """nanoGPT at batch 12 read 'B_simple > 3.28 (lower bound)': B_simple may be far above 12
    or below it, so 'raising the batch toward 3.28' (what the panel said) was wrong. Later
    it read > 16.3: B_simple is then above 12 for sure, and raising toward 16.3 is right."""
    bound = NoiseScaleReading(estimator="per_example", lower_bound=3.28, samples=80)
    text = words(bound, batch=12)
    assert "at batch 12 a step is worth ≤79% of a noiseless step" in text
    assert "too early to say whether a larger batch pays" in text and "raising" not in text
    assert "B=12 step worth ≤79% · too early" in words(bound, batch=12, compact=True)
    risen = NoiseScaleReading(estimator="per_example", lower_bound=16.3, samples=200)
    assert "raising the batch toward 16.3" in words(risen, batch=12)  # 12 < B_simple for sure
    assert "B=12 step worth ≤42% · raise B" in words(risen, batch=12, compact=True)
    off = words(None, capability=Capability(False, "turned off: attach(noise_scale=None)"))
    assert off == "B_simple: n/a — turned off: attach(noise_scale=None)"
    assert words(None, capability=None) == "waiting for the job…"


def test_enough_steps_and_no_estimate_says_why_not_collecting():
    """|G|² below zero beyond its error after enough steps (BatchNorm): the reason, once,
    instead of 'collecting 30/30' and a 'last step skipped'."""
    why = "per-example norms read |G|² below zero: BatchNorm's batch statistics couple them"
    reading = NoiseScaleReading(
        estimator="per_example", samples=40, needed=30, effective=40.0, note=why
    )
    text = words(reading)
    assert f"B_simple: none — {why}" in text
    assert "collecting" not in text and "last step skipped" not in text


def test_biased_preconditioned_and_partial_estimates_say_so():
    reading = NoiseScaleReading(
        b_simple=500.0,
        stderr=30.0,
        estimator="sequential",
        biased=True,
        coverage=0.67,
        preconditioned=True,
        note="non-finite gradients (e.g. a mixed-precision overflow)",
        skipped_steps=3,
    )
    text = words(reading)
    assert "biased: consecutive steps, for comparison only" in text
    assert "estimate: sequential · 67% of params · Adam-preconditioned · BIASED" in text
    assert "last step skipped: non-finite gradients" in text and "3 steps skipped" in text


def test_lines_are_kept_by_priority_and_wrapped():
    reading = NoiseScaleReading(b_simple=1200.0, stderr=40.0, estimator="per_example")
    lines = describe(reading, ON, 128)
    kept = fit(lines, 32, 4)
    assert kept[0][0].text.startswith("B_simple") and sum(len(p) for _, p in kept) <= 4
    assert all(len(part) <= 32 for _, parts in kept for part in parts)
    assert len(fit(lines, 32, 1)) == 1  # the headline always shows


def test_log_ticks():
    assert log_ticks(128, 1500) == [200.0, 500.0, 1000.0]
    assert log_ticks(64, 180) == [70.0, 100.0, 150.0]  # narrow: the finer series
    assert log_ticks(31, 34) == []
    assert len(log_ticks(1, 10**7)) <= 5


async def test_the_panel_at_120x40_shows_estimate_meaning_and_chart():
    app = scripted_app(gpu=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await dashboard_ready(pilot)
        await pilot.pause(0.3)
        text = text_of(app, "#noise-text")
        assert "B_simple ≈ 1.32k ± 41" in text
        assert "at batch 128 a step is worth ≈9%" in text
        assert "McCandlish" in text
        chart = app.screen.query_one(NoiseChart)
        assert chart.display and chart.size.height >= 7
        assert app.screen.query_one("#noise-key").display
        assert app.screen.query_one("#events").outer_size.height >= 4


async def test_the_panel_at_80x24_keeps_the_headline_and_the_events():
    for gpu in (True, False):
        app = scripted_app(gpu=gpu)
        async with app.run_test(size=(80, 24)) as pilot:
            await dashboard_ready(pilot)
            await pilot.pause(0.3)
            assert "B_simple ≈ 1.32k ± 41" in text_of(app, "#noise-text")
            assert not app.screen.query_one(NoiseChart).display
            assert app.screen.query_one("#events").outer_size.height >= 4
            text = text_of(app, "#noise-text")
            # the meaning, short, and the advisor's answer beside it (issue 41)
            assert "B=128 step worth ≈9% · advice:" in text and "stay at 128" in text


async def test_a_job_without_the_noise_scale_says_why():
    app = scripted_app(noise=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await dashboard_ready(pilot)
        assert "B_simple: n/a — not enabled" in text_of(app, "#noise-text")


def before_an_estimate(noise: NoiseScaleReading) -> BsmonApp:
    """The scripted session cut before its first estimate, every metrics reading ``noise``."""
    script = messages()
    for message in script:
        if isinstance(message, protocol.History):
            message.points = [p for p in message.points if p.step < 30]
        if isinstance(message, protocol.Metrics):
            message.noise = noise
            message.b_simple = None
    return BsmonApp(ScriptedSource("resnet-cifar", script, clock=lambda: NOW))


async def test_collecting_before_the_first_estimate():
    app = before_an_estimate(
        NoiseScaleReading(
            estimator="per_example", coverage=1.0, samples=12, needed=30, effective=12.0
        )
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await dashboard_ready(pilot)
        assert "B_simple: collecting 12/30 steps" in text_of(app, "#noise-text")
        assert not app.screen.query_one(NoiseChart).display


SPENT = (
    "collecting 25/30 measured steps; the warm-up's allowance is spent: measuring about 1 step "
    "in 150 now (the cost budget)"
)


def test_the_jobs_status_is_drawn_as_it_is():
    """What the estimate is doing without a number is the job's words (issue 43: 'collecting
    25/30 steps' for 200+ steps read as hung; a BatchNorm job waited for nothing)."""
    spent = NoiseScaleReading(estimator="per_example", needed=30, effective=25.0, status=SPENT)
    text = words(spent)
    assert f"B_simple: {SPENT}" in text and "collecting 25/30 steps" not in text
    why = "none — BatchNorm in training mode couples the examples; waiting will not bring one"
    unmeasurable = NoiseScaleReading(estimator="microbatch", status=why)
    text = words(unmeasurable)
    assert f"B_simple: {why}" in text and "no step measured yet" not in text


async def test_the_panel_shows_that_measuring_goes_on_after_the_warm_up():
    app = before_an_estimate(
        NoiseScaleReading(
            estimator="per_example", samples=25, needed=30, effective=25.0, status=SPENT
        )
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await dashboard_ready(pilot)
        shown = " ".join(text_of(app, "#noise-text").split())
        assert "B_simple: collecting 25/30 measured steps; the warm-up's allowance is spent" in (
            shown
        )
        assert "1 step in 150 now" in shown


async def test_a_real_job_shows_a_live_estimate(bsmon_dir):
    torch.manual_seed(0)
    job = Regression(ISO, seed=0)
    optimizer = torch.optim.SGD(job.model.parameters(), lr=0.0)
    mon = attach(job.model, optimizer, batch_size=128, name="noisy", noise_budget=None)
    app = BsmonApp(follow_job(mon.socket_path, "noisy", bsmon_dir))
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await dashboard_ready(pilot)
            xs, ys = job.batches(300, 128)

            def train() -> None:
                for x, y in zip(xs, ys, strict=True):
                    (0.5 * (job.model(x).squeeze(-1) - y).square().mean()).backward()
                    optimizer.step()
                    optimizer.zero_grad()
                mon.flush()

            await asyncio.to_thread(train)
            await wait_for(
                pilot,
                lambda: "B_simple ≈" in text_of(app, "#noise-text"),
                what="a live B_simple",
            )
            text = text_of(app, "#noise-text")
            assert "a step is worth" in text and "estimate: per example" in text
            assert screen.snapshot.latest.noise.estimator == "per_example"
    finally:
        mon.close()


def test_the_demo_job_serves_a_live_b_simple(bsmon_dir, processes):
    """The issue's "done when": `bsmon demo` has a live B_simple with its band to show."""
    job = processes.python(
        "-m", "bsmon.probes.demo", "--steps", "0", "--name", "noisy-demo", "--report-every", "0"
    )
    path = wait_until(
        lambda: next(iter(bsmon_dir.glob(f"{job.pid}.sock")), None),
        timeout=60,
        message="the demo job's socket",
    )
    with JobConnection(path) as conn:
        hello = conn.hello()
        assert hello.noise_scale.available and "per-example" in hello.noise_scale.reason
        noise = metrics_until(conn, lambda m: m.b_simple is not None).noise
    assert noise.estimator == "per_example" and noise.coverage == 1.0
    assert noise.stderr > 0 and noise.ci_low < noise.b_simple < noise.ci_high
