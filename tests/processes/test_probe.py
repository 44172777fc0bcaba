"""The max-batch-size probe: planning, the recipe, the sidecar end to end on the CPU under a
memory budget, failures (crash, hang, runaway memory), and a job left exactly as it was."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time

import psutil
import pytest
import torch
from torch import nn

from bsmon.probes import attach
from bsmon.probes.maxbatch import plan, recipe
from bsmon.probes.maxbatch.job import default_cpu_budget
from bsmon.probes.wire import describe_prediction, protocol
from bsmon.probes.wire.client import JobConnection
from bsmon.probes.wire.protocol import ProbePoint

from ..helpers import ROOT, interruptible, wait_until

MiB = 1 << 20

# -- planning (pure) -----------------------------------------------------------------------


def point(size: int, peak: int, fits: bool = True, static: int = 0, speed: float = 0.0):
    return ProbePoint(
        batch_size=size,
        fits=fits,
        peak_bytes=peak,
        static_bytes=static,
        samples_per_s=speed or None,
    )


def test_the_plan_starts_at_the_jobs_size_and_aims_high_then_stops():
    budget, held, per_sample = 1_000_000_000, 100_000_000, 100_000  # room for 9000 samples
    assert plan.next_size(64, [], budget) == 64
    first = point(64, held + 64 * per_sample, static=held)
    second = plan.next_size(64, [first], budget)
    assert second == 512  # 60% of the one-point estimate is 5400: at most 8× what ran
    third = plan.next_size(64, [first, point(second, held + second * per_sample)], budget)
    assert third == 8100  # 90% of the fitted line's estimate
    big_first = point(1000, held + 1000 * per_sample, static=held)
    assert plan.next_size(1000, [big_first], budget) == 5400  # 60% of the one-point estimate
    done = [first, point(second, 1), point(third, 1)]
    assert plan.next_size(64, done, budget) is None  # three sizes at most
    over = point(128, held + 128 * per_sample, fits=False)  # ran, over the budget: a reading
    assert plan.next_size(64, [first, over], budget) is None
    oom = ProbePoint(batch_size=4096, fits=False, note="out of memory")  # no reading
    assert plan.next_size(64, [first, oom], budget) == 512  # halfway on a log scale, once
    assert plan.next_size(64, [first, oom, point(512, 1)], budget) is None
    assert plan.next_size(64, [], budget, max_size=32) == 32
    assert plan.next_size(2000, [point(2000, 999 * MiB, static=10 * MiB)], budget) is None


def test_conclusions_anchor_the_intercept_on_the_job_and_never_predict_a_failed_size():
    points = [point(64, 200 * MiB), point(1000, 300 * MiB), point(2000, 400 * MiB)]
    predicted, extrapolation, fit = plan.conclude(points, 1000 * MiB)
    slope = fit.slope
    assert slope == pytest.approx(100 * MiB / 1000) and fit.curvature == 0  # one line
    assert predicted == int(8000 * 0.95) and extrapolation == pytest.approx(4.0)
    with_job = plan.conclude(points, 1000 * MiB, job_points=[(64, 300 * MiB)])
    assert with_job[2].intercept == pytest.approx(300 * MiB - slope * 64)  # the job's own point
    failed = [*points, point(3000, 500 * MiB, fits=False)]  # ran, over the budget
    assert plan.conclude(failed, 1000 * MiB)[0] == int(2999 * 0.95)
    oom = [*points, point(3000, 0, fits=False)]  # an OOM where the line said it fits
    assert plan.conclude(oom, 1000 * MiB)[0] == int(2500 * 0.95)  # halfway from 2000


def test_a_size_that_ran_over_the_budget_still_measures_the_slope():
    noisy_small = [point(32, 337 * MiB), point(600, 339 * MiB)]  # RSS noise: slope too low
    over = point(40_000, 1040 * MiB, fits=False)
    predicted, _, fit = plan.conclude([*noisy_small, over], 768 * MiB)
    slope = fit.slope
    assert slope == pytest.approx((1040 - 339) * MiB / (40_000 - 600))
    assert fit.curvature == 0  # the small sizes' 2 MiB rise is noise, not a bend
    assert predicted == int(((768 - 339) * MiB / slope + 600) * 0.95)


def pairwise_peak(size: float) -> float:
    """A contrastive loss's memory: weights, a per-sample part, and B×B similarity matrices."""
    return 300 * MiB + 20_000 * size + 16 * size * size


def test_memory_that_grows_faster_than_the_batch_is_fitted_with_its_curve():
    budget = 1000 * MiB
    truth = max(b for b in range(1, 10_000) if pairwise_peak(b) <= budget)
    points = [point(size, int(pairwise_peak(size))) for size in (64, 3000, 4500)]
    predicted, _, fit = plan.conclude(points, budget)
    assert fit.curvature > 0
    assert int(truth * 0.95) - 2 <= predicted <= truth
    assert pairwise_peak(predicted) <= budget  # the line through the two largest says more:
    line = plan.line_fit([(p.batch_size, p.peak_bytes) for p in points[-2:]])
    by_line = int(plan.largest_within(*line, budget) * 0.95)
    assert pairwise_peak(by_line) > budget  # ... and would run out of memory


def test_the_prediction_says_its_shape_and_whether_a_step_confirmed_it():
    result = protocol.ProbeResult(
        status="ok",
        predicted_max=5000,
        extrapolation=1.3,
        fit_curvature_bytes=16.0,
        confirmation="untested: the step at 5,000 did not fit (out of memory); 4,096 is ...",
    )
    words = describe_prediction(result)
    assert "curve fit: memory grows faster than the batch" in words
    assert words.endswith("; untested: the step at 5,000 did not fit (out of memory); 4,096 is ...")
    result.fit_curvature_bytes, result.confirmation = None, None
    assert "(a prediction: line fit," in describe_prediction(result)


def test_on_a_gpu_the_allocators_reserved_bytes_bound_the_prediction():
    """Reserved (block rounding, fragmentation) growing faster than the tensors held: the
    allocator runs out when it cannot reserve more, so the smaller prediction wins."""
    budget = 16 * 1024 * MiB
    points = [
        ProbePoint(batch_size=b, fits=True, peak_bytes=alloc, reserved_bytes=reserved)
        for b, alloc, reserved in (
            (16, 1300 * MiB, 1400 * MiB),
            (90, 5000 * MiB, 5600 * MiB),
            (134, 7200 * MiB, 8300 * MiB),
        )
    ]
    predicted, _, fit = plan.conclude(points, budget)
    by_allocated = plan.MemoryFit(*plan.line_fit([(90, 5000 * MiB), (134, 7200 * MiB)]))
    assert predicted < int(by_allocated.largest_within(budget) * 0.95)
    assert fit.peak(predicted) <= budget and fit.slope == pytest.approx(2700 * MiB / 44)


def test_the_prediction_is_confirmed_by_a_step_or_the_largest_size_that_ran_is_used():
    ran = [point(64, 1), point(600, 1), point(900, 1)]
    assert plan.confirmation_target(1200, ran) == (1200, "")
    assert plan.confirmation_target(1200, ran, max_size=1000)[0] == 1000
    target, why = plan.confirmation_target(1200, ran, room=1000)  # a GPU shared with the job
    assert target == 1000 and "1,200 is untested" in why
    target, why = plan.confirmation_target(1200, ran, room=800)  # no room above what ran
    assert target is None and why.startswith("untested") and "900 is the largest" in why
    assert plan.confirmation_target(850, ran)[0] is None  # 900 ran: nothing to confirm
    assert plan.confirmation_target(None, ran) == (None, "")
    assert plan.confirmed_max(1200, ran) == 900  # untested: the largest size that ran
    assert plan.confirmed_max(1200, [*ran, point(1200, 1)]) == 1200  # confirmed
    assert plan.confirmed_max(1200, [*ran, point(1200, 1, fits=False)]) == 900  # it failed
    assert plan.confirmed_max(850, ran) == 850
    assert plan.confirmed_max(None, ran) == 900


def test_the_default_cpu_budget_says_why_it_is_what_it_is():
    budget, why = default_cpu_budget()
    available = psutil.virtual_memory().available
    assert budget == min(1 << 30, available // 4)
    assert why.startswith(f"25% of the {available / 2**30:.1f} GiB available")
    assert ("capped at 1 GiB" in why) == (budget == 1 << 30)


# -- the recipe ----------------------------------------------------------------------------


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.head = nn.Linear(8, 10, bias=False)
        self.head.weight = self.embed.weight  # tied weights must stay tied

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x))


def test_the_structure_travels_without_weights_bsmon_hooks_or_syncs():
    model = Tied()
    model.register_forward_hook(lambda *a: None)  # a user hook travels
    model.embed.weight.data.fill_(7.0)
    rebuilt = recipe.load_structure(recipe.pickle_structure(model), torch.device("cpu"))
    assert rebuilt.head.weight is rebuilt.embed.weight
    assert rebuilt.embed.weight.shape == (10, 8) and not torch.all(rebuilt.embed.weight == 7.0)
    assert len(rebuilt._forward_hooks) == 1
    assert torch.all(model.embed.weight == 7.0)  # the job's model is untouched


def user_hook(_module, _args):
    return None


def test_the_users_hooks_travel_to_the_sidecar(bsmon_dir):
    model = nn.Linear(4, 2)
    model.register_forward_pre_hook(user_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with attach(model, optimizer, batch_size=4):
        rebuilt = recipe.load_structure(recipe.pickle_structure(model), torch.device("cpu"))
    assert list(rebuilt._forward_pre_hooks.values()) == [user_hook]


def test_optimizer_spec_keeps_groups_and_drops_what_the_constructor_refuses():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    optimizer = torch.optim.AdamW(
        [{"params": model[0].parameters(), "lr": 0.1}, {"params": model[1].parameters()}],
        lr=0.01,
        betas=(0.8, 0.9),
    )
    cls, kwargs, groups = recipe.optimizer_spec(optimizer, model)
    assert cls is torch.optim.AdamW and kwargs["betas"] == (0.8, 0.9)
    assert [g["indices"] for g in groups] == [[0, 1], [2, 3]] and groups[0]["lr"] == 0.1
    rebuilt = recipe.build_optimizer(
        recipe.Recipe(
            model=b"",
            optimizer_class=cls,
            optimizer_kwargs=kwargs,
            param_groups=groups,
            batch=None,
            batch_size=1,
            device="cpu",
            job_batch_size=1,
        ),
        model,
    )
    assert [g["lr"] for g in rebuilt.param_groups] == [0.1, 0.01]


def test_tile_grows_the_batch_along_dim_zero_only():
    x, y, mask = torch.arange(6).reshape(3, 2), torch.tensor([0, 1, 2]), torch.ones(5)
    grown = recipe.tile({"x": x, "y": y, "mask": mask}, 3, 7)
    assert grown["x"].shape == (7, 2) and grown["y"].tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert grown["mask"].shape == (5,)  # not a batch dimension


# -- the sidecar, end to end on the CPU ------------------------------------------------------


def test_a_probe_the_job_ends_during_is_said_in_the_record(bsmon_dir):
    from bsmon.probes.record.reader import open_record

    _, _, mon = train_a_little(probe_step=hang, record=bsmon_dir / "run.jsonl")
    with mon:
        assert mon.job.prober.start(2000 * MiB, 60)["started"]
        wait_until(lambda: mon.job.prober.reading().message.startswith("starting"), message="start")
    with open_record(bsmon_dir / "run.jsonl") as reader:
        events = [e for e in reader.lines() if isinstance(e, protocol.Event)]
    (stopped,) = [e for e in events if e.kind == "probe_result"]
    assert stopped.level == "warning" and stopped.data["status"] == "killed"
    assert stopped.message.startswith("probe killed: the job ended ")
    assert mon.job.prober.reading().result.error == stopped.data["error"]  # what the screen shows
    assert not list(bsmon_dir.glob("*.recipe"))


def test_a_job_without_a_socket_leaves_no_directory_behind(bsmon_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    _, _, mon = train_a_little(probe_step=hang, serve=False)
    with mon:
        assert not list(tmp_path.glob("bsmon-*"))  # nothing made before a probe needs it
        assert mon.job.prober.start(2000 * MiB, 60)["started"]
        wait_until(lambda: list(tmp_path.glob("bsmon-probe-*/*.recipe")), message="the recipe")
    wait_until(lambda: not list(tmp_path.glob("bsmon-*")), message="the probe's directory gone")


def train_a_little(budget_job_batch: int = 32, **options):
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(512, 64), torch.randint(0, 8, (512,)))
    mon = attach(
        model, optimizer, batch_size=budget_job_batch, loss_fn=nn.CrossEntropyLoss(), **options
    )
    for i, (x, y) in enumerate(mon.dataloader(data, shuffle=True)):
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        if i == 4:
            break
    return model, optimizer, mon


def test_a_cpu_probe_under_a_budget_end_to_end(bsmon_dir):
    model, _, mon = train_a_little()
    before = [p.detach().clone() for p in model.parameters()]
    with mon:
        budget = 700 * MiB
        result = mon.probe(memory_budget=budget, timeout=180)
        assert result.status == "ok", result.error
        trials = [p for p in result.points if not p.confirmation]
        sizes = [p.batch_size for p in trials]
        assert 2 <= len(sizes) <= plan.MAX_SIZES and sizes[0] == 32 and sizes == sorted(sizes)
        seen = [(p.batch_size, p.fits, p.peak_bytes, p.note) for p in result.points]
        # the third size comes from the slope of two small ones (1 MiB apart in 300 MiB), so
        # it may land over the budget: then it is said so and ends the search, as for a user
        over = [p for p in trials if not p.fits]
        assert over in ([], trials[-1:]), seen
        assert all(p.note == "over the memory budget" and p.peak_bytes > budget for p in over)
        fitting = [p for p in result.points if p.fits]
        assert fitting == [p for p in result.points if p not in over], seen
        assert all(p.peak_bytes <= budget and p.step_time_s > 0 for p in fitting)
        assert result.confirmation is not None and result.confirmation.startswith("confirmed")
        assert result.predicted_max is not None and result.predicted_max == result.confirmed_max
        largest_run = max(p.batch_size for p in trials if p.fits)
        if result.predicted_max > largest_run:  # the prediction is run once more, last
            assert result.points[-1].confirmation and len(result.points) == len(trials) + 1
            assert result.points[-1].batch_size == result.predicted_max == result.max_batch_size
        else:  # a trial already ran a full step at or above it: nothing more to run
            assert len(result.points) == len(trials) and not over
            assert result.max_batch_size == largest_run
        assert result.extrapolation is not None and result.budget_bytes == budget
        assert result.recommendation is not None
        assert result.recommendation.batch_size <= result.predicted_max
        # the probe's recommendation is the advisor's answer, the one every surface shows
        advice = mon.stats()["advice"]
        assert advice["batch_size"] == result.recommendation.batch_size
        assert result.recommendation.reasons[: len(advice["reasons"])] == advice["reasons"]
        assert result.recommendation.confidence == advice["confidence"]
        assert result.what_ifs[0].technique == "as is"
        assert result.budget_note == "as asked"
        (note,) = result.notes  # on the CPU the sidecar and the job share the cores
        assert "the sidecar ran on the CPU cores the job was using" in note
        assert mon.job.batch_control.probe_max == result.predicted_max
        assert mon.flush()
        events = [e for e in mon.job.telemetry.events if e.kind.startswith("probe")]
        assert [e.kind for e in events] == ["probe_started", "probe_result"]
        assert events[1].data["max_batch_size"] == result.max_batch_size
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert not list(bsmon_dir.glob("*.recipe"))  # the private recipe file is gone


def greedy(model, batch):
    """Sizes above the job's need 200 MB more: over the budget, under the watchdog's line."""
    x, y = batch
    extra = torch.ones(50 * MiB) if len(x) > 32 else None  # 200 MB
    return nn.functional.cross_entropy(model(x), y) + (0 if extra is None else 0 * extra[0])


def test_a_size_over_the_budget_is_a_point_that_does_not_fit(bsmon_dir):
    _, _, mon = train_a_little(probe_step=greedy)
    with mon:
        result = mon.probe(memory_budget=450 * MiB, timeout=180)
    assert result.status == "ok", result.error
    first, second, confirmation = result.points
    assert first.batch_size == 32 and first.fits
    assert not second.fits and second.note == "over the memory budget"
    assert not confirmation.fits and confirmation.note == "confirmation: over the memory budget"
    assert result.max_batch_size == result.confirmed_max == 32  # the fallback: what ran
    assert result.recommendation.stay


def pairwise_loss(model, batch):
    """A contrastive loss: every sample against every other, a B×B matrix (memory grows with
    the square of the batch)."""
    x, _ = batch
    z = model(x)
    return nn.functional.cross_entropy(z @ z.T, torch.arange(len(x)))


def test_memory_that_grows_faster_than_the_batch_gets_a_confirmed_recommendation(bsmon_dir):
    _, _, mon = train_a_little(512, probe_step=pairwise_loss)
    budget = 800 * MiB
    with mon:
        result = mon.probe(memory_budget=budget, timeout=240)
    # a line from two sizes under-predicts such memory: a size far over the budget fails as
    # out of memory in the sidecar (no watchdog kill), and the prediction is confirmed
    assert result.status == "ok", result.error
    assert all(p.peak_bytes <= budget for p in result.points if p.fits)
    (confirmation,) = [p for p in result.points if p.confirmation]
    assert confirmation.fits and confirmation.batch_size == result.predicted_max
    assert result.confirmation == (
        f"confirmed: a full step at {result.predicted_max:,} ran within the budget"
    )
    assert result.confirmed_max == result.predicted_max == result.max_batch_size > 512
    assert result.recommendation.batch_size <= result.confirmed_max
    assert mon.job.batch_control.probe_max == result.confirmed_max


RAN: set[int] = set()  # in the sidecar: the sizes whose step ran


def jumps_past_what_ran(model, batch):
    """Like the job at the first two sizes; any size past those asks for 1.5 GiB more (an
    activation or workspace that appears only at large sizes, which no fit can see)."""
    x, y = batch
    if len(RAN) >= 2 and len(x) > max(RAN):
        torch.ones(1536 * MiB // 4)
    loss = nn.functional.cross_entropy(model(x), y)
    RAN.add(len(x))
    return loss


def test_a_prediction_that_does_not_hold_is_never_recommended(bsmon_dir):
    _, _, mon = train_a_little(probe_step=jumps_past_what_ran)
    with mon:
        result = mon.probe(memory_budget=700 * MiB, timeout=180)
    assert result.status == "ok", result.error
    *trials, confirmation = result.points
    assert confirmation.confirmation and not confirmation.fits
    assert confirmation.batch_size == result.predicted_max
    assert confirmation.note == "confirmation: out of memory"  # the sidecar's own cap
    ran = max(p.batch_size for p in trials if p.fits)
    assert result.confirmed_max == result.max_batch_size == ran
    assert result.confirmation == (
        f"untested: the step at {result.predicted_max:,} did not fit (out of memory); "
        f"{ran:,} is the largest size that ran"
    )
    assert result.recommendation.batch_size <= ran
    assert f"the prediction is {result.confirmation}" in result.recommendation.reasons
    assert mon.job.batch_control.probe_max == ran


def test_a_recommendation_that_runs_out_of_memory_in_the_job_steps_back_and_says_so(
    bsmon_dir,
):
    model, optimizer, mon = train_a_little()
    data = torch.utils.data.TensorDataset(torch.randn(4096, 64), torch.randint(0, 8, (4096,)))
    with mon:
        result = mon.probe(memory_budget=700 * MiB, timeout=180)
        # after five steps the advice is to wait at 32 (B_simple unresolved): the user takes
        # the next size the probe found to fit instead, as `+` would
        recommended = 64
        assert result.status == "ok" and result.max_batch_size >= recommended, result
        assert result.recommendation.batch_size == 32, result.recommendation
        with JobConnection(mon.socket_path) as conn:  # `a` on the probe screen, confirmed
            reply = conn.request(
                protocol.SetBatchSize(
                    value=recommended, reason="the probe's recommendation", confirm=True
                )
            )
            assert reply.ok, reply.error
        for x, y in mon.dataloader(data):
            with mon.guard():
                if len(x) > 32:  # the job holds more than the sidecar could see
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
                nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
                optimizer.zero_grad()
            if mon.step >= 8:
                break
        assert mon.batch_size == 32
        assert mon.flush()
        (oom,) = [e for e in mon.job.telemetry.events if e.kind == "oom"]
        assert oom.message.startswith(
            f"out of memory at batch {recommended} (the probe's recommendation); "
            "back to 32, the last size that ran; "
        )
        assert "ran out of memory" in mon.request_batch_size(recommended).error


def crash(model, batch):
    os.kill(os.getpid(), signal.SIGSEGV)


def hang(model, batch):
    time.sleep(600)


def hog(model, batch):
    """Lifts the sidecar's own allocation cap (as C code could) and runs away."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
    hog.keep = torch.ones(128 * MiB)  # 512 MiB on top of the runtime: far over the budget
    time.sleep(600)


@pytest.mark.parametrize(
    ("probe_step", "timeout", "status", "message"),
    [
        (crash, 120, "crashed", "the sidecar crashed (SIGSEGV)"),
        (hang, 8, "timeout", "timed out after 8 s"),
        (hog, 120, "killed", "killed by the watchdog: the sidecar used"),
    ],
)
def test_a_sidecar_that_crashes_hangs_or_runs_away_is_a_clear_result(
    bsmon_dir, probe_step, timeout, status, message
):
    _, _, mon = train_a_little(probe_step=probe_step)
    with mon:
        budget = 400 * MiB if probe_step is hog else 2000 * MiB
        result = mon.probe(memory_budget=budget, timeout=timeout)
        assert mon.step == 5  # the job is fine
    assert result.status == status and message in result.error
    assert not list(bsmon_dir.glob("*.recipe"))


def test_refusals_say_what_is_missing(bsmon_dir):
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with attach(model, optimizer, batch_size=4) as mon:
        assert "needs a batch the job has used" in mon.probe().error
        mon.set_probe_batch((torch.randn(4, 4), torch.zeros(4, dtype=torch.long)))
        assert "needs attach(..., loss_fn=...)" in mon.probe().error
        with pytest.raises(ValueError, match="needs a tensor"):
            mon.set_probe_batch("text")
    with attach(None, optimizer, batch_size=4) as mon:
        assert "needs the model" in mon.probe().error


def test_a_second_probe_while_one_runs_is_refused_over_the_socket(bsmon_dir):
    _, _, mon = train_a_little(probe_step=hang)
    with mon, JobConnection(mon.socket_path) as conn:
        first = conn.request(protocol.ProbeCommand(memory_budget=2000 * MiB, timeout_s=20))
        assert first.ok and first.result["started"]
        second = conn.request(protocol.ProbeCommand())
        assert not second.ok and "a probe is already running" in second.error
        bad = conn.request(protocol.ProbeCommand(memory_budget=-5))
        assert not bad.ok
        metrics = conn.wait_for(protocol.Metrics, timeout=60)
        while metrics.probe.status != "running":
            metrics = conn.wait_for(protocol.Metrics, timeout=60)
        assert metrics.probe.started is not None


def run_jobs(processes, tmp_path, **jobs: list[str]) -> dict[str, dict]:
    """Run probe_job.py once per keyword, all at once; return each one's JSON output."""
    started = {}
    for name, args in jobs.items():
        out = tmp_path / f"{name}.json"
        started[name] = (
            out,
            processes.python(
                str(ROOT / "tests" / "probe_job.py"),
                *args,
                str(out),
                "--budget",
                str(400 * MiB),
                cwd=tmp_path,
            ),
        )
    results = {}
    for name, (out, job) in started.items():
        _, err = job.communicate(timeout=300)
        assert job.returncode == 0, err.decode()
        results[name] = json.loads(out.read_text())
    return results


def test_a_model_class_from_main_travels_to_the_sidecar(bsmon_dir, processes, tmp_path):
    result = run_jobs(processes, tmp_path, main=["probe", "--probe-at", "5"])["main"]
    assert result["probe"]["status"] == "ok", result["probe"]["error"]
    assert result["probe"]["max"] > 32 and result["probe"]["sizes"] >= 2


def test_the_job_is_identical_with_and_without_a_probe(bsmon_dir, processes, tmp_path):
    runs = run_jobs(processes, tmp_path, plain=["twin"], probed=["twin", "--probe-at", "20"])
    plain, probed = runs["plain"], runs["probed"]
    assert probed["probe"]["status"] == "ok", probed["probe"]["error"]
    for key in ("weights", "optimizer", "torch_rng", "python_rng", "order", "steps"):
        assert probed[key] == plain[key], key


def test_ctrl_c_on_bsmon_probe_stops_the_sidecar_and_says_so(bsmon_dir, processes):
    import psutil

    from ..helpers import wait_until

    _, _, mon = train_a_little(probe_step=hang)
    with mon:
        cli = processes.python(
            "-m",
            "bsmon.tui.cli",
            "probe",
            str(mon.socket_path),
            "--timeout",
            "120",
            preexec_fn=interruptible,
        )

        def sidecar() -> psutil.Process | None:
            kids = psutil.Process().children()
            return next((p for p in kids if "bsmon.probes.maxbatch.sidecar" in p.cmdline()), None)

        side = wait_until(sidecar, timeout=60, message="the probe's sidecar")
        cli.send_signal(signal.SIGINT)
        _, err = cli.communicate(timeout=30)
        assert cli.returncode == 130 and "Traceback" not in err.decode()
        assert err.decode().splitlines()[-1] == (
            f"bsmon: probe interrupted: stopped the probe's sidecar (pid {side.pid}); "
            "the job goes on"
        )
        result = mon.job.prober.wait(30)
        assert result.status == "killed" and "stopped (SIGTERM) from outside" in result.error
        assert mon.step == 5  # the job is fine
