"""benchmarks/autopilot.py's pure pieces: time to a target, simulated time, the step-time fit
and the goals' verdicts (no training here)."""

from __future__ import annotations

import importlib
import math
import time

import pytest

from ..gpu_check_kit import BENCHMARKS  # noqa: F401  (puts benchmarks/ on the import path)

bench = importlib.import_module("autopilot")  # benchmarks/autopilot.py (no torch imported)
outcomes = importlib.import_module("autopilot_kit.outcomes")
verdicts = importlib.import_module("autopilot_kit.verdicts")
ArmResult, Reach, Run = outcomes.ArmResult, outcomes.Reach, outcomes.Run
TaskOutcome = outcomes.TaskOutcome
fit_step_time, goals, quantile, table = (
    outcomes.fit_step_time,
    verdicts.goals,
    outcomes.quantile,
    verdicts.table,
)
simulated_time, time_to_target = outcomes.simulated_time, outcomes.time_to_target

EVALS = [  # (examples, steps, wall s, loss)
    (0, 0, 0.0, 2.3),
    (4096, 256, 1.0, 1.2),
    (8192, 512, 2.0, 1.0),
    (12288, 768, 3.5, 0.8),
]


def test_time_to_target_interpolates_between_the_evaluations_around_it():
    reach = time_to_target(EVALS, 0.9)  # halfway from 1.0 (8192) to 0.8 (12288)
    assert reach == pytest.approx(Reach(10240, 640, 2.75))


def test_time_to_target_at_an_evaluation_is_that_evaluation():
    assert time_to_target(EVALS, 1.0) == pytest.approx(Reach(8192, 512, 2.0))
    assert time_to_target(EVALS, 2.3) == Reach(0, 0, 0.0)


def test_time_to_target_takes_the_first_crossing_and_never_a_nan():
    evals = [(0, 0, 0.0, 2.0), (10, 1, 1.0, float("nan")), (20, 2, 2.0, 0.5), (30, 3, 3.0, 2.0)]
    # NaN never reaches; the crossing is read from the evaluation before the first one below
    assert time_to_target(evals, 1.0) == pytest.approx(Reach(20, 2, 2.0))
    assert time_to_target(EVALS, 0.5) is None


def test_simulated_time_is_the_sum_of_half_plus_batch_over_the_steps():
    sizes = [16] * 100 + [32] * 50 + [64] * 10
    reach = Reach(examples=sum(sizes), steps=len(sizes), wall_s=1.0)
    for half in (16, 64, 256, 1024):
        assert simulated_time(reach, half) == sum(half + b for b in sizes)
    assert simulated_time(None, 64) == math.inf


def test_the_step_time_fit_recovers_t0_and_c():
    t0, c = 4e-4, 6.5e-6
    t0_fit, c_fit = fit_step_time({b: t0 + c * b for b in (16, 32, 64, 128, 256, 512, 1024)})
    assert t0_fit == pytest.approx(t0)
    assert c_fit == pytest.approx(c)
    assert t0_fit / c_fit == pytest.approx(61.5, rel=1e-3)


def test_quantile_is_linear_and_keeps_infinity():
    assert quantile([4.0, 1.0, 3.0, 2.0, 5.0], 0.5) == 3.0
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.25) == pytest.approx(1.75)
    assert quantile([1.0, math.inf, math.inf], 0.75) == math.inf


# -- goals -----------------------------------------------------------------------------------


def run(examples, steps, wall, *, claimed=None, max_size=16, bad_lr=False, targets=(1.0,)):
    reach = Reach(examples, steps, wall) if examples is not None else None
    return Run({t: reach for t in targets}, max_size, bad_lr, claimed_gain=claimed)


def arm(label, kind, batch, runs, half=None):
    return ArmResult(label, kind, batch, 0.1, half, runs)


def outcome(auto_steps=200, auto_examples=60_000, auto_wall=2.0, claimed=2.4, **changes):
    """A task where fixed 16 takes 4,000 steps (64k examples, 6 s), fixed 256 400 steps
    (100k, 2.5 s), and the autopilot ``auto_steps`` steps and ``auto_examples`` examples."""
    seeds = 5

    def same(*args, **kwargs):
        return [run(*args, **kwargs) for _ in range(seeds)]

    auto_runs = changes.pop(
        "auto_runs",
        same(auto_examples, auto_steps, auto_wall, claimed=claimed, max_size=1024),
    )
    arms = [
        arm("fixed 16", "fixed", 16, same(64_000, 4000, 6.0)),
        arm("fixed 256", "fixed", 256, same(100_000, 400, 2.5)),
        arm("auto, measured B½", "auto", 16, auto_runs, half=None),
    ]
    arms += [arm(f"auto {h}", "auto", 16, auto_runs, half=h) for h in (16, 64, 256, 1024)]
    return TaskOutcome("t", 16, 1024, (1.0,), arms, **changes)


def test_a_good_autopilot_meets_every_goal():
    verdicts = goals([outcome()])
    # fixed 16 at B½=64: 64·4000 + 64k = 320k; auto: 64·200 + 60k = 72.8k → 4.4×
    assert "4.40×" in verdicts[1].detail
    assert "3.00×" in verdicts[2].detail  # wall: 6 s / 2 s
    assert all(v.met for v in verdicts), verdicts


def test_vs_start_needs_two_times_simulated_and_one_and_a_half_wall():
    # 2,000 steps of 32: 64·2000 + 64k = 192k at B½=64 → 1.67× (< 2); wall 6/5 = 1.2× (< 1.5)
    verdicts = goals([outcome(auto_steps=2000, auto_examples=64_000, auto_wall=5.0, claimed=1.2)])
    sim, wall = verdicts[1], verdicts[2]
    assert sim.met is False and "1.67×" in sim.detail
    assert wall.met is False and "1.20×" in wall.detail


def test_vs_best_fixed_is_gated_up_to_half_256_only():
    # best fixed at B½=1024: fixed 256 (1024·400 + 100k = 509.6k); auto 1024·450 + 100k = 560.8k
    # → 0.91; at B½=256 fixed 256 gives 202.4k, auto 215.2k → 0.94: met
    verdicts = goals([outcome(auto_steps=450, auto_examples=100_000)])
    assert verdicts[3].met is True
    # 1,500 steps: at B½=1024 0.31× (not gated), at B½=256 202.4k / 484k = 0.42×: not met
    verdicts = goals([outcome(auto_steps=1500, auto_examples=100_000)])
    assert verdicts[3].met is False
    assert "B½=256 0.42×" in verdicts[3].detail
    assert "B½=1024 0.31× (not gated)" in verdicts[3].detail


def test_the_claim_must_be_within_a_quarter_of_the_measured_wall_clock_gain():
    # measured: 6.0 / 2.0 = 3×; a claim of 2.4 is -20% (met), 2.2 is -27% (not met)
    assert goals([outcome(claimed=2.4)])[4].met is True
    verdict = goals([outcome(claimed=2.2)])[4]
    assert verdict.met is False and "-27%" in verdict.detail
    assert goals([outcome(claimed=None)])[4].met is False  # no claim is not an honest claim


def test_robustness_fails_on_a_missed_target_a_nan_rate_or_a_batch_above_the_ceiling():
    good = run(60_000, 200, 2.0, claimed=2.4, max_size=1024)
    for bad in (
        run(None, 0, 0.0, claimed=2.4, max_size=1024),
        run(60_000, 200, 2.0, claimed=2.4, max_size=1024, bad_lr=True),
        run(60_000, 200, 2.0, claimed=2.4, max_size=2048),
    ):
        verdict = goals([outcome(auto_runs=[good] * 4 + [bad])])[0]
        assert verdict.met is False, verdict
    assert goals([outcome(auto_runs=[good] * 5)])[0].met is True


def test_a_missing_arm_is_not_measured_and_one_failing_task_fails_the_goal():
    no_auto = outcome()
    no_auto.arms = [a for a in no_auto.arms if a.kind != "auto"]
    verdicts = goals([no_auto])
    assert [v.met for v in verdicts] == [None] * 6
    slow = outcome(auto_steps=2000, auto_examples=64_000)
    assert goals([outcome(), slow])[1].met is False


def test_a_run_that_needs_half_again_the_examples_of_its_end_sizes_fixed_batch_stalled():
    # fixed 16 needs 64k examples, fixed 256 100k: at 64, half-way on a log scale, 82k
    assert outcomes.reference_examples({16: 64_000.0, 256: 100_000.0}, 64) == 82_000
    assert outcomes.reference_examples({16: 64_000.0, 256: 100_000.0}, 1024) == 100_000
    steady = [run(60_000, 200, 2.0, max_size=256) for _ in range(5)]
    counted = outcomes.stalls(outcome(auto_runs=steady), 1.0)
    assert counted == {"fixed": (0, 10), "changing": (0, 25)}
    plateau = [*steady[:4], run(151_000, 900, 9.0, max_size=256)]  # > 1.5 × 100k
    task = outcome(auto_runs=plateau)
    assert outcomes.stalls(task, 1.0)["changing"] == (5, 25)  # the same runs in each auto arm
    verdict = goals([task])[5]
    assert verdict.met is False
    assert "ramps and autopilot 5/25, fixed 0/10" in verdict.detail
    assert goals([outcome(auto_runs=steady)])[5].met is True


def test_the_table_prints_ratios_against_the_best_fixed_batch():
    lines = table(outcome(), 1.0)
    fixed_16 = next(line for line in lines if line.lstrip().startswith("fixed 16"))
    # at B½=16 the best fixed is 256: 16·400 + 100k = 106.4k; fixed 16: 16·4000 + 64k = 128k
    assert "0.83×" in fixed_16
    assert "5/5" in fixed_16


def test_the_exact_noise_scale_is_trace_over_squared_mean_from_each_examples_gradient():
    """Against per-example gradients taken one example at a time by autograd (300 examples:
    the chunks of 256 meet)."""
    import torch
    from torch import nn

    lag = importlib.import_module("autopilot_kit.lag")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    inputs, labels = torch.randn(300, 5), torch.randint(0, 3, (300,))
    grads = []
    for x, y in zip(inputs, labels, strict=True):
        model.zero_grad()
        nn.functional.cross_entropy(model(x[None]), y[None]).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]).double())
    flat = torch.stack(grads)
    trace = float(flat.var(0, unbiased=True).sum())
    g2 = float(flat.mean(0).pow(2).sum()) - trace / len(flat)
    exact_trace, exact_g2 = lag.exact_parts(model, nn.functional.cross_entropy, inputs, labels)
    assert (exact_trace, exact_g2) == pytest.approx((trace, g2), rel=1e-6)
    assert exact_trace / exact_g2 == pytest.approx(trace / g2, rel=1e-6)


def test_the_cost_is_the_median_of_each_rounds_paired_change_with_its_quartiles():
    changes = bench._paired([2.04, 1.12, 0.98, 1.04], [2.0, 1.0, 1.0, 1.0])
    assert changes == pytest.approx([0.02, 0.12, -0.02, 0.04])
    assert bench._share(changes) == "+3.0% [+1.0%…+6.0%]"


def test_the_look_clock_times_the_autopilots_looks_and_puts_the_method_back():
    from bsmon.probes.batch.autopilot import Autopilot

    costs = importlib.import_module("autopilot_kit.costs")
    original = Autopilot.on_metrics
    calls = []

    class Busy:
        def on_metrics(self, metrics: object) -> None:
            calls.append(metrics)
            deadline = time.thread_time() + 0.02
            while time.thread_time() < deadline:
                pass

    try:
        Autopilot.on_metrics = Busy.on_metrics  # what the clock wraps
        with costs.LookClock() as clock:
            Autopilot.on_metrics(Busy(), "metrics")
        assert calls == ["metrics"]
        assert clock.seconds >= 0.02
        assert Autopilot.on_metrics is Busy.on_metrics
    finally:
        Autopilot.on_metrics = original


def test_the_fastest_ramp_holds_the_start_then_doubles_at_the_autopilots_own_pace():
    from bsmon.probes.batch.autopilot import SETTLE_STEPS, WARMUP_STEPS

    training = importlib.import_module("autopilot_kit.training")
    sizes = [training.ramp_size(step, 16, 256) for step in range(WARMUP_STEPS + 6 * SETTLE_STEPS)]
    assert sizes[:WARMUP_STEPS] == [16] * WARMUP_STEPS
    doubled = sizes[WARMUP_STEPS::SETTLE_STEPS]
    assert doubled == [32, 64, 128, 256, 256, 256]
    for start in range(WARMUP_STEPS, len(sizes), SETTLE_STEPS):  # one size per decision
        assert len(set(sizes[start : start + SETTLE_STEPS])) == 1
    assert training.ramp_size(10**6, 16, 1024) == 1024


def test_the_ramp_sampler_deals_every_example_once_an_epoch_and_keeps_counting_steps():
    import torch

    training = importlib.import_module("autopilot_kit.training")
    sampler = training.RampSampler(3000, 4, 64, torch.Generator().manual_seed(0))
    for _epoch in range(2):
        first_step = sampler.steps
        batches = list(sampler)
        assert sorted(i for batch in batches for i in batch) == list(range(3000))
        expected = [training.ramp_size(first_step + k, 4, 64) for k in range(len(batches))]
        assert [len(b) for b in batches[:-1]] == expected[:-1]
        assert 0 < len(batches[-1]) <= expected[-1]  # an epoch's last batch may be short
    assert sampler.steps > 50 + 4 * 25  # the second epoch went on from where the first ended
    assert len(batches[0]) == 64


def test_a_ramp_is_a_bound_never_the_best_fixed_batch():
    task = outcome()
    before = {half: task.best_simulated(1.0, half) for half in (16, 64, 256)}
    task.arms.append(arm("fastest ramp to 256", "ramp", 256, [run(50_000, 250, 1.0)] * 5))
    assert {half: task.best_simulated(1.0, half) for half in (16, 64, 256)} == before
    ramp_row = next(line for line in table(task, 1.0) if "fastest ramp to 256" in line)
    # at B½=64 the best fixed (256: 64·400 + 100k = 125.6k) over the ramp's 64·250 + 50k = 66k
    assert "1.90×" in ramp_row


def test_the_lag_window_spreads_eight_steps_over_the_last_quarter_of_the_run():
    lag = importlib.import_module("autopilot_kit.lag")
    assert lag.window_steps(800) == [625, 650, 675, 700, 725, 750, 775, 800]
    steps = lag.window_steps(3200)
    assert len(steps) == lag.WINDOW_POINTS and steps[0] == 2500 and steps[-1] == 3200
    assert lag.window_steps(4) == [3, 4]  # a run this young has fewer distinct steps


class Attached(Exception):
    """Raised by ``attach_options``'s stand-in once it has kept what ``attach`` was given."""


def attach_options(monkeypatch) -> list[dict]:
    """``bsmon.probes.attach`` replaced: each call's options kept, then ``Attached`` raised
    (a benchmark run ends there, before any training)."""
    import bsmon.probes

    options: list[dict] = []

    def attach(*_args: object, **kwargs: object) -> None:
        options.append(kwargs)
        raise Attached

    monkeypatch.setattr(bsmon.probes, "attach", attach)
    return options


def test_a_noise_budget_what_if_reaches_the_autopilots_attach_and_says_so(monkeypatch):
    tasks = importlib.import_module("autopilot_kit.tasks")
    training = importlib.import_module("autopilot_kit.training")
    options = attach_options(monkeypatch)
    task = tasks.TASKS["synthetic"]
    what_if = training.Arm(16, 0.01, autopilot=True, half=64, noise_budget=0.1)
    assert what_if.label == "auto, B½=64 declared, noise 0.1"
    assert training.Arm(16, 0.01, autopilot=True, half=64).label == "auto, B½=64 declared"
    for arm in (what_if, training.Arm(16, 0.01, autopilot=True)):
        with pytest.raises(Attached):
            training.train(task, arm, 10, target=0.85, budget_examples=1024)
    assert options[0]["noise_budget"] == 0.1
    assert "noise_budget" not in options[1]  # bsmon's own default


@pytest.mark.parametrize("share", ["0", "-0.1", "1.5"])
def test_a_noise_budget_outside_a_share_is_refused(share, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--noise-budget", share])
    assert exit_info.value.code == 2
    assert "--noise-budget must be a share in (0, 1]" in capsys.readouterr().err


def test_wall_at_interpolates_the_training_clock_between_evaluations():
    assert outcomes.wall_at(EVALS, 6144) == pytest.approx(1.5)
    assert outcomes.wall_at(EVALS, 12288) == 3.5
    assert outcomes.wall_at(EVALS, 99_999) == 3.5  # past the last: its clock


def test_switched_on_late_the_claim_is_judged_from_the_switch_on():
    """Fixed 16 takes 6 s, 3 s of it before the switch-on's 32k examples; the autopilot, the
    same run until then, takes 2 s more: 1.5× from the switch-on (3.0× over the whole run,
    which the claim's span never saw)."""
    fixed_evals = ((0, 0, 0.0, 2.3), (32_000, 2000, 3.0, 1.4), (64_000, 4000, 6.0, 1.0))
    fixed = Run({1.0: Reach(64_000, 4000, 6.0)}, 16, False, evals=fixed_evals)
    late = Run(
        {1.0: Reach(60_000, 2200, 5.0)}, 1024, False, claimed_gain=1.4, switched=(32_000, 3.0)
    )
    task = outcome(auto_runs=[late] * 5)
    task.arms[0] = arm("fixed 16", "fixed", 16, [fixed] * 5)
    verdict = goals([task])[4]
    assert verdict.met is True and "claimed 1.40× vs measured 1.50× (-7%)" in verdict.detail
    late_far = Run(
        {1.0: Reach(60_000, 2200, 5.0)}, 1024, False, claimed_gain=3.0, switched=(32_000, 3.0)
    )
    task.arms[2] = arm("auto, measured B½", "auto", 16, [late_far] * 5)
    assert goals([task])[4].met is False  # 3× claimed against 1.5× measured from the switch-on


def test_a_switch_on_what_if_attaches_the_autopilot_off_and_says_so_in_its_label(monkeypatch):
    tasks = importlib.import_module("autopilot_kit.tasks")
    training = importlib.import_module("autopilot_kit.training")
    options = attach_options(monkeypatch)
    late = training.Arm(16, 0.01, autopilot=True, switch_on=800)
    assert late.label == "auto, measured B½, on at step 800"
    with pytest.raises(Attached):
        training.train(tasks.TASKS["synthetic"], late, 10, target=0.85, budget_examples=1024)
    assert options[0]["autopilot"] is False
    with pytest.raises(SystemExit):
        bench.main(["--switch-on", "-1"])
