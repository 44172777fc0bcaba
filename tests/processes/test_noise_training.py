"""The noise scale in real training loops: mixed precision and clipping, non-finite steps,
layers bsmon cannot measure, faults in its own hooks, the automatic choice, the socket."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bsmon.probes import attach
from bsmon.probes.noise import per_example
from bsmon.probes.noise.budget import BUDGET_VARIABLE
from bsmon.probes.noise.controller import TRACKING
from bsmon.probes.noise.warmup import LIMIT, WARMUP_FIRST
from bsmon.probes.wire import protocol
from bsmon.probes.wire.client import JobConnection
from workloads.noise_jobs import ANISO, ISO, ISO_BIAS, Regression, measuring, train

from ..helpers import wait_until
from ..watch import metrics_until

BATCH = 128


def fit_squares(model, optimizer, steps: int, shape: tuple[int, ...], flush=None) -> None:
    """Steps of an arbitrary regression (the output towards 0) on fresh random inputs."""
    for _ in range(steps):
        model(torch.randn(*shape)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        if flush is not None:
            assert flush.flush()


def noise_events(mon) -> list[protocol.Event]:
    return [e for e in mon.job.telemetry.events if e.kind in ("noise_scale", "agent_error")]


def within(value: float, truth: float, rel: float = 0.10) -> bool:
    return value is not None and abs(value - truth) <= rel * truth


# -- mixed precision, clipping, non-finite steps -------------------------------------------


def test_measured_after_unscaling_and_before_clipping():
    """A GradScaler whose scale doubles every 100 steps, and clipping to a tiny norm after
    unscale_: B_simple and its components must come out as without either."""
    torch.manual_seed(0)
    job = Regression(ISO_BIAS, seed=0)
    optimizer = torch.optim.SGD(job.model.parameters(), lr=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=100)
    xs, ys = job.batches(2000, BATCH)
    with measuring(
        job.model,
        optimizer,
        BATCH,
        noise_window=2000,
        grad_scaler=scaler,
    ) as mon:
        for x, y in zip(xs, ys, strict=True):
            loss = 0.5 * (job.model(x).squeeze(-1) - y).square().mean()
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(job.model.parameters(), max_norm=1e-4)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
        assert mon.flush()
        noise = mon.stats()["noise"]
        components = mon._noise.tracker.averages.estimate()
    assert scaler.get_scale() >= 2.0**20  # the scale really changed along the way
    assert within(noise["b_simple"], ISO_BIAS.truth()), noise
    # absolute units, as after unscale_ (mean reduction: the per-example gradient itself)
    assert within(components.g2, 0.256 + 0.04, rel=0.15)
    assert within(components.trace, 12 * 0.256 + 10 * 0.04 + 11, rel=0.05)


def test_non_finite_steps_are_skipped_and_counted():
    """Every 100th batch overflows: the scaler skips that optimizer step, bsmon skips (and
    counts) the measurement, and the estimate stays right."""
    torch.manual_seed(0)
    job = Regression(ISO, seed=0)
    optimizer = torch.optim.SGD(job.model.parameters(), lr=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    xs, ys = job.batches(2000, BATCH)
    with measuring(
        job.model,
        optimizer,
        BATCH,
        grad_scaler=scaler,
    ) as mon:
        for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
            loss = 0.5 * (job.model(x).squeeze(-1) - y).square().mean()
            if i % 100 == 50:
                loss = loss * float("inf")
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
        assert mon.flush()
        noise = mon.stats()["noise"]
        events = noise_events(mon)
    # the overflowing pass and the next one share a window (no optimizer step in between)
    assert noise["skipped_steps"] == 20
    assert noise["samples"] == 2000 - 1 - 2 * 20  # the first step is never measured
    assert noise["estimator"] == "per_example"  # two passes once is not accumulation
    assert within(noise["b_simple"], ISO.truth())
    assert any("non-finite" in e.message for e in events)


# -- what per-example norms can and cannot measure -------------------------------------------


class Scale(nn.Module):
    """A layer bsmon does not know: its parameter is left out of both terms."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gain


def test_coverage_with_an_unsupported_layer():
    model = nn.Sequential(nn.Linear(10, 16), Scale(16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with measuring(model, optimizer, 32) as mon:
        fit_squares(model, optimizer, 60, (32, 10))
        assert mon.flush()
        noise = mon.stats()["noise"]
        capability = mon._noise.capability
    measured = 10 * 16 + 16 + 16 + 1
    assert noise["coverage"] == pytest.approx(measured / (measured + 16))
    assert "not measured: Scale" in noise["detail"]
    assert noise["samples"] == 59 and noise.get("skipped_steps", 0) == 0
    assert capability.available and "per-example" in capability.reason


class FunctionalHead(nn.Module):
    """Uses its Linear's parameters without calling it: the Linear's hook never fires."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(6, 8)
        self.proj = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(torch.tanh(self.body(x)), self.proj.weight, self.proj.bias)


def test_a_layer_used_functionally_is_found_and_left_out():
    model = FunctionalHead()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    with measuring(model, optimizer, 16) as mon:
        # each step flushed: the agent's verdict reaches the training thread by the next step
        fit_squares(model, optimizer, 42, (16, 6), flush=mon)
        noise = mon.stats()["noise"]
        events = noise_events(mon)
    assert noise["coverage"] == pytest.approx((6 * 8 + 8) / (6 * 8 + 8 + 8 + 1))
    # step 2 (the first measured) showed the unaccounted gradient, step 3 was gathered
    # before proj was left out
    assert noise["skipped_steps"] == 2 and noise["samples"] == 39
    assert any("left out proj" in e.message for e in events)


class Reused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Linear(5, 5)
        self.head = nn.Linear(5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.block(torch.tanh(self.block(x)))))


def test_a_layer_run_twice_per_pass_is_left_out():
    model = Reused()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    with measuring(model, optimizer, 16) as mon:
        fit_squares(model, optimizer, 40, (16, 5))
        assert mon.flush()
        noise = mon.stats()["noise"]
        events = noise_events(mon)
    assert noise["coverage"] == pytest.approx(6 / 36)
    assert noise["skipped_steps"] == 1 and noise["samples"] == 38
    assert any("ran 2 times in one forward pass" in e.message for e in events)


def test_tied_weights_are_left_out():
    emb = nn.Embedding(20, 8)
    head = nn.Linear(8, 20, bias=True)
    head.weight = emb.weight  # tied, as in many language models
    model = nn.Sequential(emb, nn.LayerNorm(8), head)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    with attach(model, optimizer, batch_size=4, serve=False) as mon:
        discovery = mon._noise.source.discovery
        coverage = mon._noise.source.coverage
    assert discovery.left_out == {"tied to another module": 160}
    assert coverage == pytest.approx((16 + 20) / (160 + 16 + 20))


def test_a_model_without_measurable_layers_waits_for_accumulation():
    model = Scale(4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    with attach(model, optimizer, batch_size=4, serve=False) as mon:
        capability = mon._noise.capability
        assert mon._noise.source.estimator == "microbatch"
    assert "needs gradient accumulation" in capability.reason
    with (
        pytest.raises(ValueError, match="no layer bsmon can measure"),
        attach(model, optimizer, serve=False, noise_scale="per_example") as mon,
    ):
        raise ValueError(mon._noise.capability.reason)


# -- the automatic choice, off, faults ----------------------------------------------------------


def small_bn_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 4)
    )


def test_a_batchnorm_model_waits_for_accumulation_instead_of_per_example_norms():
    """BatchNorm in training mode couples the examples of a batch: auto measures micro-batches
    (each with its own statistics) once the job accumulates, and says why; in eval mode the
    statistics are fixed and per-example norms fit."""
    torch.manual_seed(0)
    model = small_bn_cnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, optimizer, batch_size=16, serve=False, noise_budget=None) as mon:
        noise = mon._noise
        assert noise.source.estimator == "microbatch"
        reason = noise.capability.reason
        tick, noise.agent_tick = noise.agent_tick, lambda telemetry: None
        fit_squares(model, optimizer, 70, (16, 3, 8, 8))  # an agent late, as on a busy machine
        noise.agent_tick = tick
        assert not noise.source._handles  # between the checks for accumulation: no hook
        assert mon.flush()
        waiting = mon.stats()["noise"]
        assert "waiting for gradient accumulation" in waiting["detail"]
        # waiting cannot help: the reason at once, in the reading and once as a warning
        assert waiting["status"].startswith("none — BatchNorm in training mode (BatchNorm2d)")
        assert "this job takes one backward pass a step, so waiting will not" in waiting["status"]
        assert "attach(..., micro_batch_size=N)" in waiting["status"]
        said = [e for e in noise_events(mon) if e.message.startswith("noise scale: no estimate")]
        # the step the job was seen not to accumulate, however late the agent came
        assert len(said) == 1 and said[0].level == "warning" and said[0].step <= 64
        for _ in range(120):  # seen at the next check (one step in 64), measured from then
            for _ in range(4):
                model(torch.randn(4, 3, 8, 8)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        assert mon.flush()
        reading = mon.stats()["noise"]
    assert "BatchNorm in training mode (BatchNorm2d) couples the examples" in reason
    assert reading["samples"] >= 30 and "4 micro-batches per step" in reading["detail"]
    assert not (reading["status"] or "").startswith("none")  # measured: no longer unmeasurable
    model.eval()
    with attach(model, optimizer, batch_size=16, serve=False) as mon:
        assert mon._noise.source.estimator == "per_example"


def test_auto_switches_to_micro_batches_and_back():
    torch.manual_seed(0)
    job = Regression(ANISO, seed=0)
    optimizer = torch.optim.SGD(job.model.parameters(), lr=0.0)
    with measuring(job.model, optimizer, 64) as mon:
        train(job, optimizer, steps=10, batch=64)
        assert mon._noise.source.estimator == "per_example"
        train(job, optimizer, steps=10, batch=64, micro=4)
        assert mon._noise.source.estimator == "microbatch"
        train(job, optimizer, steps=10, batch=64)
        assert mon._noise.source.estimator == "per_example"
        assert mon.flush()
        messages = [e.message for e in noise_events(mon)]
    assert any("gradient accumulation, now measured with microbatch" in m for m in messages)
    assert any(
        "no more gradient accumulation, now measured with per_example" in m for m in messages
    )


def test_off_installs_nothing():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with attach(model, optimizer, batch_size=4, serve=False, noise_scale=None) as mon:
        assert not [m for m in model.modules() if m._forward_hooks or m._forward_pre_hooks]
        assert not any(p._backward_hooks for p in model.parameters())
        model(torch.randn(4, 4)).sum().backward()
        optimizer.step()
        assert mon.noise_scale is None
        capability = mon._noise.capability
    assert not capability.available and "noise_scale=None" in capability.reason


def test_unknown_modes_and_options_are_refused():
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="noise_scale must be one of"):
        attach(model, optimizer, serve=False, noise_scale="fast")
    with pytest.raises(ValueError, match="Adam-family"):
        attach(model, optimizer, serve=False, noise_preconditioned=True)
    with pytest.raises(ValueError, match="noise_budget"):
        attach(model, optimizer, serve=False, noise_budget=0)
    with pytest.raises(TypeError, match="grad_scaler"):
        attach(model, optimizer, serve=False, grad_scaler=object())


@pytest.mark.parametrize(
    ("value", "budget", "warned"),
    [("all", None, False), ("0.05", 0.05, False), ("2", 0.01, True), ("most", 0.01, True)],
)
def test_the_budget_variable_sets_the_budget_or_says_why_not(value, budget, warned, monkeypatch):
    """BSMON_NOISE_BUDGET, for a job whose attach() nobody can change (bsmon run, tests)."""
    monkeypatch.setenv(BUDGET_VARIABLE, value)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, optimizer, batch_size=4, serve=False, noise_budget=0.01) as mon:
        fit_squares(model, optimizer, 40, (4, 4))
        assert mon._noise.budget.fraction == budget
        said = [e.message for e in mon.job.telemetry.events if e.kind == "noise_budget"]
    why = f"{BUDGET_VARIABLE}={value!r} is not 'all' or a share in (0, 1]; using 0.01"
    assert said == ([why] if warned else [])


def test_a_fault_in_the_hooks_never_reaches_the_job(monkeypatch):
    def broken(*_args, **_kwargs):
        raise RuntimeError("bsmon bug")

    monkeypatch.setattr(per_example, "accumulates", broken)  # every measured layer's hook
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with measuring(model, optimizer, 8) as mon:
        fit_squares(model, optimizer, 20, (8, 4))
        assert mon.flush()
        stats = mon.stats()
        events = noise_events(mon)
    assert stats["step"] == 20 and stats["errors"] >= 20
    assert stats["noise"]["samples"] == 0 and stats["noise"].get("b_simple") is None
    errors = [e for e in events if e.kind == "agent_error"]
    assert len(errors) == 1 and "bsmon bug" in errors[0].message


def test_adam_preconditioned_variant():
    """Isotropic inputs and δ ∝ 1: Adam's preconditioner is close to a multiple of the
    identity, so the preconditioned noise scale is close to the raw one."""
    torch.manual_seed(0)
    job = Regression(ISO, seed=0)
    optimizer = torch.optim.Adam(job.model.parameters(), lr=0.0)
    with measuring(
        job.model,
        optimizer,
        BATCH,
        noise_preconditioned=True,
    ) as mon:
        train(job, optimizer, steps=2000, batch=BATCH)
        assert mon.flush()
        noise = mon.stats()["noise"]
        capability = mon._noise.capability
    assert noise["preconditioned"] is True and "Adam-preconditioned" in capability.reason
    # the first measured step (the second) already has Adam state
    assert noise.get("skipped_steps", 0) == 0 and noise["samples"] == 1999
    assert within(noise["b_simple"], ISO.truth(), rel=0.15)


@contextlib.contextmanager
def under_the_budget(steps: int):
    """A regression job trained ``steps`` steps under a 1% cost budget: its monitor, flushed."""
    torch.manual_seed(0)
    job = Regression(ISO, seed=0)
    optimizer = torch.optim.SGD(job.model.parameters(), lr=0.0)
    with attach(job.model, optimizer, batch_size=BATCH, serve=False, noise_budget=0.01) as mon:
        train(job, optimizer, steps=steps, batch=BATCH)
        assert mon.flush()
        yield mon


def test_the_cost_budget_measures_a_share_of_steps_and_says_so():
    with under_the_budget(600) as mon:
        noise = mon.stats()["noise"]
    assert 0 < noise["samples"] < 600
    assert "of steps (cost budget), averaging the last ~" in noise["detail"]


def test_collecting_after_the_warm_ups_allowance_says_measuring_goes_on_under_the_budget():
    """minGPT read 'collecting 25/30 steps' for 200+ steps once the warm-up's allowance was
    spent (issue 43): the reading now says the rest come under the cost budget, and how
    often. The warm-up's end by its limit is set by hand here (it depends on the machine's
    prices); the words are the controller's own. The warm-up's first measured step is the
    16th: 8 steps past it leave the estimate collecting."""
    with under_the_budget(WARMUP_FIRST + 8) as mon:
        noise = mon._noise
        reading = noise.reading
        collecting = f"collecting {reading.effective:.0f}/{reading.needed} measured steps"
        assert 0 < reading.effective < reading.needed and reading.status == collecting
        noise.warmup.ended, noise.phase, noise.budget.share = LIMIT, TRACKING, 1 / 150
        spent = noise._reading().status
    assert spent == (
        f"{collecting}; the warm-up's allowance is spent: measuring about 1 step in 150 now "
        "(the cost budget)"
    )


# -- over the socket ---------------------------------------------------------------------------


def test_hello_and_metrics_carry_the_estimate(bsmon_dir):
    torch.manual_seed(0)
    job = Regression(ISO, seed=0)
    optimizer = torch.optim.SGD(job.model.parameters(), lr=0.0)
    with attach(job.model, optimizer, batch_size=BATCH, name="noisy", noise_budget=None) as mon:
        train(job, optimizer, steps=200, batch=BATCH)
        assert mon.flush()
        with JobConnection(mon.socket_path) as conn:
            hello = conn.hello()
            assert hello.noise_scale.available
            assert "per-example gradient norms" in hello.noise_scale.reason
            train(job, optimizer, steps=20, batch=BATCH)
            assert mon.flush()
            metrics = metrics_until(conn, lambda m: m.step == 220)
    noise = metrics.noise
    assert metrics.b_simple == noise.b_simple and noise.b_simple is not None
    assert noise.estimator == "per_example" and noise.coverage == 1.0
    assert noise.stderr > 0 and noise.ci_low < noise.b_simple < noise.ci_high
    assert noise.samples == 219 and noise.needed == 30
    assert mon.noise_scale == noise.b_simple


# -- a GPU, where there is one ------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("mode", ["per_example", "microbatch", "sequential"])
def test_no_device_synchronisation_on_the_training_thread(mode):
    """torch raises on any synchronising call while the sync debug mode is "error"."""
    device = torch.device("cuda")
    model = nn.Sequential(nn.Linear(32, 64), nn.LayerNorm(64), nn.ReLU(), nn.Linear(64, 1))
    model = model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda")
    micro = 2 if mode == "microbatch" else 1
    with attach(
        model,
        optimizer,
        batch_size=64,
        serve=False,
        noise_scale=mode,
        noise_budget=None,
        grad_scaler=scaler,
    ) as mon:
        x = torch.randn(64, 32, device=device)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(50):
                for chunk in x.chunk(micro):
                    with torch.autocast("cuda", dtype=torch.float16):
                        loss = model(chunk).float().square().mean() / micro
                    scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
                # not scaler.step(): it reads found_inf with .item(), a synchronization of its
                # own that the debug mode would raise on; bsmon's hooks run in optimizer.step
                optimizer.step()
                scaler.update()
                optimizer.zero_grad()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert mon.flush()
        assert mon.stats()["errors"] == 0
        # 50 steps: about 50 measured, or 25 pairs for the sequential estimator (its pairs do not
        # overlap: one sample per two steps)
        wait_until(lambda: mon.stats()["noise"]["samples"] >= 20, message="measured steps")


def test_nothing_is_registered_on_the_model_in_any_mode():
    """bsmon's forward hooks are global (torch.nn.modules.module) and only while measuring;
    nothing it does is stored on a module, so the model copies and pickles as it would."""
    before = dict(nn.modules.module._global_forward_hooks)
    for mode in ("per_example", "microbatch", "sequential"):
        model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with attach(model, optimizer, batch_size=4, serve=False, noise_scale=mode) as mon:
            fit_squares(model, optimizer, 5, (4, 4))
            assert mon.stats()["errors"] == 0
            tables = [
                table
                for module in model.modules()
                for table in (
                    module._forward_hooks,
                    module._forward_pre_hooks,
                    module._backward_hooks,
                    module._backward_pre_hooks,
                )
            ]
            assert not any(tables), mode
        assert dict(nn.modules.module._global_forward_hooks) == before, mode


def test_a_gan_turns_the_estimate_off_and_independent_models_do_not():
    """The generator's backward pass runs through the discriminator: its noise scale is not
    defined. Two unrelated models, or two optimizers over one model, change nothing."""

    def pair():
        return nn.Linear(4, 1), nn.Linear(3, 4)

    disc, gen = pair()
    opt_d, opt_g = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (disc, gen))
    with attach(disc, opt_d, serve=False, noise_budget=None) as mon:
        for _ in range(4):
            disc(torch.randn(8, 4)).square().mean().backward()
            opt_d.step()
            disc.zero_grad()
            disc(gen(torch.randn(8, 3))).mean().backward()  # through the discriminator
            opt_g.step()
            gen.zero_grad()
        assert mon._noise.source is None and "ran through this model" in mon._noise.why

    a, b = pair()
    head = nn.Linear(4, 1)
    model = nn.Sequential(b, head)
    opt_a, opt_b, opt_head = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (a, b, head))
    with attach(model, opt_head, serve=False, noise_budget=None) as mon:
        for _ in range(4):
            a(torch.randn(8, 4)).square().mean().backward()  # an unrelated model
            opt_a.step()
            model(torch.randn(8, 3)).square().mean().backward()
            opt_b.step()  # another optimizer, over this model's first layer
            opt_head.step()
            a.zero_grad()
            model.zero_grad()
        assert mon._noise.source is not None, mon._noise.why
