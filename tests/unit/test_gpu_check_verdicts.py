"""Each GPU check's verdict on recorded readings: what passes, what fails, and what is only
reported (no GPU needed: the readings are given)."""

from __future__ import annotations

import math
import types

import pytest

from bsmon.probes.wire.protocol import (
    Capability,
    DeviceReading,
    ProbePoint,
    ProbeResult,
    Recommendation,
    WhatIf,
)

from ..gpu_check_kit import BENCHMARKS  # noqa: F401 (puts benchmarks/ on the import path)

# isort: split
from gpucheck import (
    anatomy_check,
    dashboard_check,
    nvml_check,
    probe_check,
    probe_verdict,
    pytest_check,
    timing_check,
)
from gpucheck.boundary import Boundary, search_boundary

GIB, MIB = 2**30, 2**20


def verdicts(finding) -> dict[str, bool | None]:
    return {c.what: c.ok for c in finding.criteria}


# -- NVML against nvidia-smi -----------------------------------------------------------------


def moment(used_smi_mib: float, power_agent: float = 450.0, process: int | None = 2 * GIB) -> dict:
    """The agent reads 11 GiB used of 80 GiB, 450 W, 51 °C; nvidia-smi as given."""
    agent = DeviceReading(
        index=0,
        name="NVIDIA H100 80GB HBM3",
        uuid="GPU-1",
        util_percent=100.0,
        memory_used_bytes=11 * GIB,
        memory_total_bytes=80 * GIB,
        temperature_c=51.0,
        power_w=power_agent,
        torch_allocated_bytes=1 * GIB,
        torch_reserved_bytes=int(1.5 * GIB),
        torch_peak_bytes=int(1.2 * GIB),
        torch_reserved_peak_bytes=2 * GIB,
        alloc_retries=0,
        ooms=0,
    )
    smi = {
        "utilization.gpu": 99.0,
        "memory.used": used_smi_mib,
        "memory.total": 80 * 1024.0,
        "temperature.gpu": 52.0,
        "power.draw": 455.0,
    }
    return {
        "agent": agent,
        "gpu": Capability(True),
        "smi": smi,
        "process_used": process,
        "lag_s": 0.05,
    }


def test_the_allocators_counters_must_be_read_and_the_peak_reserved_cover_the_reserved():
    import msgspec

    good = nvml_check.allocator_counters_criterion(moment(10 * 1024.0))
    assert good.ok and good.measured == "2.00 GiB (2% of the device) ≥ 1.50 GiB; 0 retries, 0 OOMs"
    unread = moment(10 * 1024.0)
    unread["agent"] = msgspec.structs.replace(unread["agent"], alloc_retries=None)
    assert nvml_check.allocator_counters_criterion(unread).ok is False
    low = moment(10 * 1024.0)
    low["agent"] = msgspec.structs.replace(low["agent"], torch_reserved_peak_bytes=GIB)
    assert nvml_check.allocator_counters_criterion(low).ok is False


def test_nvml_readings_that_agree_pass_with_the_drivers_reserved_memory_counted():
    # nvidia-smi shows 10 GiB used and 1 GiB reserved apart; NVML v1 counts both as used
    finding = nvml_check.judge([moment(10 * 1024.0)] * 5, reserved_mib=1024.0, uuid="GPU-1")
    assert finding.passed, finding.criteria
    memory = next(c for c in finding.criteria if c.what.startswith("memory used"))
    assert memory.what == "memory used, agent vs nvidia-smi used + reserved"
    assert memory.measured == "median gap 0.0 MiB"
    allocator = finding.criteria[-1]
    assert allocator.measured == "1.00 GiB ≤ 1.50 GiB ≤ 2.00 GiB (context 512 MiB)"
    assert finding.tables[0].rows[0][1] == "100.0 / 99.0"


def test_nvml_readings_that_disagree_fail_and_a_hidden_pid_is_only_reported():
    moments = [moment(10.5 * 1024.0, power_agent=300.0, process=-1)] * 3  # 512 MiB: within 1%
    finding = nvml_check.judge(moments, reserved_mib=None, uuid="GPU-1")
    assert not finding.passed
    ok = verdicts(finding)
    assert ok["power, agent vs nvidia-smi"] is False  # 155 W off, tolerance 68 W
    assert ok["memory used, agent vs nvidia-smi"] is True
    assert ok["torch allocator: allocated ≤ reserved ≤ the job's NVML memory"] is None
    assert finding.summary == "3 moments; off: power, agent vs nvidia-smi"


# -- the probe -------------------------------------------------------------------------------


def truth_of(boundary: int, tried: list[int] | None = None):
    """A fake trial: the sizes up to ``boundary`` fit."""

    def fits(size: int) -> bool:
        if tried is not None:
            tried.append(size)
        return size <= boundary

    return fits


def searched(label: str, bounds: Boundary, truth: int, runs: int) -> probe_verdict.Search:
    """A search run against a known boundary, its trials recorded as the GPU's would be
    (the peak grows by 21 MiB a sample over 1 GiB)."""
    search = probe_verdict.Search(label, bounds)

    def fits(size: int) -> bool:
        ok = size <= truth
        search.trials.append({"batch": size, "fits": ok, "peak_allocated": GIB + size * 21 * MIB})
        return ok

    search_boundary(fits, bounds, runs)
    return search


def probe_result(recommended: int = 486, confirmed: int | None = None) -> ProbeResult:
    result = ProbeResult(
        status="ok",
        max_batch_size=450,
        points=[ProbePoint(batch_size=b, fits=True) for b in (128, 300, 450)],
        predicted_max=486,  # 512 before its 5% margin
        what_ifs=[
            WhatIf("bf16 autocast", 900, measured=True),
            WhatIf("activation checkpointing", None, measured=False, note="not Sequential"),
        ],
        recommendation=Recommendation(recommended, ["memory"], current=128),
    )
    result.confirmed_max = confirmed  # the largest size a step confirmed
    return result


def probe_run(boundary: int, bf16_boundary: int, **how) -> probe_verdict.ModelRun:
    """The ResNet's run, its searches against the given boundaries."""
    result = probe_result(**how)
    run = probe_verdict.ModelRun("resnet", result=result)
    run.job = {
        "steps_per_s_before": 20.0,
        "steps_per_s_during": 12.0,
        "memory_fit": [1 * GIB, 20 * MIB],
        "errors": 0,
    }
    base = probe_check.as_is_search(result)
    searched_base = searched("as is", base.bounds, boundary, probe_check.PREDICTION_RUNS)
    for size in probe_check.offered_sizes(result):
        searched_base.bounds.settle(truth_of(boundary), size)
    bf16 = Boundary(900, probe_verdict.WHAT_IF_GOAL, probe_check.WHAT_IF_TOLERANCE, 450)
    run.searches = {
        "as is": searched_base,
        "bf16 autocast": searched("bf16 autocast", bf16, bf16_boundary, probe_check.WHAT_IF_RUNS),
    }
    return run


def test_probe_predictions_within_their_goals_pass():
    run = probe_run(505, 870)
    base = run.searches["as is"]
    assert base.bounds.trials[0] == (512, False)  # the prediction before its margin, first
    assert base.bounds.converged and base.bounds.low <= 505 < base.bounds.high
    finding = probe_verdict.judge([run], notes=[])
    ok = verdicts(finding)
    assert finding.passed, finding.criteria
    assert ok["resnet: predicted largest batch vs the real boundary"] is True
    assert ok["resnet: the recommendation ran out of memory?"] is True
    assert ok["resnet: bf16 autocast what-if vs its real boundary"] is True
    assert ok["resnet: activation checkpointing what-if"] is None  # not measured
    measured = {c.what: c.measured for c in finding.criteria}
    assert measured["resnet: the recommendation ran out of memory?"] == (
        f"no: 486 ≤ {base.bounds.tried_fit}, which ran; the probe did not run it"
    )
    memory = measured["resnet: the job's memory model at the largest size that fit"]
    assert memory.endswith("(-4.3%)"), memory
    speed = next(c for c in finding.criteria if c.what.endswith("while the probe ran"))
    assert speed.measured == "0.60× (20.0 → 12.0 steps/s)"
    rows = {(row[0], row[1]): row for row in finding.tables[1].rows}
    assert rows["resnet", "as is"][4].startswith("(probe: 450 ran) 512 OOM, ")
    assert finding.tables[0].rows[0][3] == "486 (not run)"


def test_a_prediction_above_the_boundary_or_a_what_if_off_by_more_than_10_percent_fails():
    finding = probe_verdict.judge([probe_run(470, 780)], notes=[])
    ok = verdicts(finding)
    # 512 is +8.9% over 470, and with the margin 486 does not fit
    assert ok["resnet: predicted largest batch vs the real boundary"] is False
    assert ok["resnet: the recommendation ran out of memory?"] is False
    assert ok["resnet: bf16 autocast what-if vs its real boundary"] is False  # +15.4%
    assert finding.summary.startswith("3 criteria off")
    recommendation = next(c for c in finding.criteria if c.what.endswith("out of memory?"))
    assert recommendation.measured.startswith("yes: 486 ≥ ")


def test_the_recommendation_alone_above_the_boundary_fails():
    """A prediction within 5% and its margin under the boundary, but the probe recommends
    more than fits (and says it ran it): the one criterion that fails."""
    finding = probe_verdict.judge([probe_run(500, 870, recommended=505, confirmed=505)], notes=[])
    assert [c.what for c in finding.criteria if c.ok is False] == [
        "resnet: the recommendation ran out of memory?"
    ]
    recommendation = next(c for c in finding.criteria if c.what.endswith("out of memory?"))
    assert recommendation.measured.endswith("which ran out of memory; the probe ran it")


def test_the_recommendation_is_tried_when_the_search_left_it_open():
    bounds = Boundary(1000, 0.05, 0.01, claimed_fit=600)
    search_boundary(truth_of(990), bounds, 6)
    assert bounds.fits(994) is None  # inside the last bracket
    tried: list[int] = []
    assert bounds.settle(truth_of(990, tried), 994) is False
    assert bounds.settle(truth_of(990, tried), 600) is True  # under a size that ran
    assert tried == [994]


def test_an_unfinished_search_fails_with_its_bracket():
    run = probe_run(505, 870)
    base = run.searches["as is"]
    base.bounds.trials = [(512, False)]
    base.trials = base.trials[:1]
    base.error = "7 s left of the 420 s budget; resnet trial at 502 skipped"
    criterion = probe_verdict.model_criteria(run)[1]
    assert criterion.ok is False
    assert criterion.measured == (
        "512; the boundary is between 450 and 512 after 1 runs; undecided (7 s left of the "
        "420 s budget; resnet trial at 502 skipped); with the margin 486 not settled"
    )


def test_a_bracket_that_decides_the_verdict_is_enough():
    """The GPT on the H100 (2026-11-24): predicted 251 before its margin; 199 fits, 202 does
    not. Out of runs before it narrows to 1%, the search still shows the prediction over by
    more than 5%, and the recommendation (238) out of memory."""
    bounds = Boundary(251, 0.05, 0.01, claimed_fit=134)
    tried: list[int] = []
    search_boundary(truth_of(200, tried), bounds, 6)
    assert tried[:3] == [251, 247, 240]  # the prediction, then a rung 2% and 5% under it
    assert not bounds.converged and bounds.low <= 200 < bounds.high
    least, most = bounds.error_range(251)
    assert 0.05 < least < most
    assert bounds.fits(238) is False
    search = probe_verdict.Search("as is", bounds)
    criterion = probe_verdict.prediction_criterion("gpt", search, 0.05, 238)
    assert criterion.ok is False
    assert f"after 6 runs (error {least:+.1%} to {most:+.1%})" in criterion.measured
    assert criterion.measured.endswith("with the margin 238 ran out of memory")


def test_the_search_starts_at_the_prediction_and_converges_from_the_probes_bounds():
    """Against every boundary within 5% of the prediction, from the size the probe ran: the
    first trial at the prediction, converged to 1% in at most 5 trials; within 10% and 3%,
    in at most 4 (the what-ifs)."""
    for goal, tolerance, runs in ((0.05, 0.01, 5), (0.10, 0.03, 4)):
        for predicted in (120, 251, 1000, 3337):
            for truth in range(math.ceil(predicted / (1 + goal)), int(predicted / (1 - goal))):
                tried: list[int] = []
                bounds = Boundary(predicted, goal, tolerance, claimed_fit=predicted // 2)
                search_boundary(truth_of(truth, tried), bounds, 99)
                assert tried[0] == predicted
                assert len(tried) <= runs, (predicted, truth, tried)
                assert bounds.converged and bounds.low <= truth < bounds.high
                assert bounds.high - bounds.low <= max(1, math.ceil(tolerance * bounds.low))


def test_the_probes_bounds_are_claims_a_trial_settles():
    # the probe saw 1,030 fail: the search stays under it, and settles it with a trial
    tried: list[int] = []
    bounds = Boundary(1000, 0.05, 0.01, claimed_fit=600, claimed_fail=1030)
    search_boundary(truth_of(1025, tried), bounds, 6)
    assert max(tried) == 1030 and tried[-1] == 1030
    assert bounds.converged and bounds.low <= 1025 < bounds.high
    # the probe ran (confirmed) 950 but it does not fit alone: the trials win
    tried = []
    bounds = Boundary(1000, 0.05, 0.01, claimed_fit=950)
    search_boundary(truth_of(900, tried), bounds, 12)
    assert 950 in tried and bounds.fits(950) is False
    assert bounds.converged and bounds.low <= 900 < bounds.high


def test_a_confirmed_size_is_the_searchs_low_bound():
    result = probe_result(confirmed=480)
    assert probe_check.probe_bounds(result) == (480, None)
    result.points.append(ProbePoint(batch_size=700, fits=False))
    assert probe_check.probe_bounds(result) == (480, 700)
    assert probe_check.probe_bounds(probe_result()) == (450, None)


def test_a_probe_that_ran_three_sizes_and_a_confirmation_is_within_its_sizes():
    result = probe_result(confirmed=486)
    result.points.append(ProbePoint(batch_size=486, fits=True))
    criterion = probe_verdict.sizes_criterion("resnet", result)
    assert (criterion.measured, criterion.ok) == ("3 + a confirmation at 486", True)
    result.points.insert(0, ProbePoint(batch_size=64, fits=True))
    assert probe_verdict.sizes_criterion("resnet", result).ok is False


# -- the step anatomy ------------------------------------------------------------------------


def totals(steps: int, forward: float, backward: float, optimizer: float, other: float = 0.0):
    step = forward + backward + optimizer + other
    per_step = {"step": step, "forward": forward, "backward": backward, "optimizer": optimizer}
    return {"steps": steps, **{k: seconds * steps for k, seconds in per_step.items()}}


def test_the_anatomy_is_judged_on_its_shares_against_the_synchronized_steps():
    """Synchronized steps are slower (4 ms against 3): only the shares are compared."""
    measured = {
        "anatomy": totals(400, 0.0010, 0.0017, 0.0003),  # 33%, 57%, 10%
        "synchronized": totals(400, 0.0013, 0.0023, 0.0004),  # 32.5%, 57.5%, 10%
        "self": totals(400, 0.0013, 0.0023, 0.0004),
        "kernels": {"forward": 0.0006, "backward": 0.0012, "optimizer": 0.0002},
    }
    criteria, rows = anatomy_check.compare(measured)
    assert [c.ok for c in criteria] == [True, True, True, None]
    assert criteria[0].measured == "33.3% vs 32.5% (0.8 points)"
    backward = ["backward", "1.70 ms", "56.7%", "2.30 ms", "57.5%", "57.5%", "1.20 ms", "60.0%"]
    assert rows[1] == backward  # ms per step of each; the kernels' share is of their total
    # the H100's anatomy (2026-11-24) against a backward that holds its kernels
    measured["anatomy"] = totals(100, 0.00180, 0.00182, 0.00019, other=0.00013)
    criteria, _ = anatomy_check.compare(measured)
    assert [c.ok for c in criteria[:3]] == [False, False, False]
    assert criteria[1].measured == "46.2% vs 57.5% (11.3 points)"


def event(name: str, start: float, end: float, *kernels: float, device: str = "CPU"):
    return types.SimpleNamespace(
        name=name,
        device_type=f"DeviceType.{device}",
        is_async=False,
        time_range=types.SimpleNamespace(start=start, end=end),
        kernels=[types.SimpleNamespace(duration=us) for us in kernels],
    )


def test_kernels_go_to_the_phase_whose_marker_was_open_when_their_op_started():
    """Two steps, in µs. Backward's ops run on autograd's thread, outside the training
    thread's marker as the profiler nests them, but inside its time window."""
    events = []
    for at in (0.0, 100.0):
        events += [
            event("check.forward", at, at + 30),
            event("aten::conv2d", at + 1, at + 20),  # its own kernels: none
            event("aten::cudnn_convolution", at + 2, at + 19, 12.0),
            event("cudaLaunchKernel", at + 3, at + 4),  # the runtime's event: no kernel
            event("check.backward", at + 30, at + 80),
            event("autograd::engine::evaluate_function: ConvBackward0", at + 35, at + 70, 30.0),
            event("check.backward", at + 30, at + 80, device="CUDA"),  # the device's copy
            event("check.optimizer", at + 80, at + 90),
            event("aten::_foreach_add_", at + 81, at + 89, 2.0, 1.0),
            event("aten::zero_", at + 92, at + 95, 5.0),  # between markers: no phase
        ]
    kernels = anatomy_check.kernels_by_phase(events, steps=2)
    assert kernels == pytest.approx({"forward": 12e-6, "backward": 30e-6, "optimizer": 3e-6})


# -- timing ----------------------------------------------------------------------------------


def test_timing_passes_when_events_match_and_nothing_synchronizes():
    times = {
        "off": [(0.0100, 0, 0), (0.0101, 0, 0)],
        "agent": [(0.0100, 0, 0), (0.0101, 0, 0)],
        "sync each step": [(0.0110, 0, 0), (0.0111, 0, 0)],
    }
    debug = {"steps": 250, "error": None, "detector": True, "errors": 0}
    debug |= {"noise_samples": 250, "sampler_errors": []}
    finding = timing_check.judge("CNN", 0.01, [0.0100] * 9, [0.0101] * 9, [0.0100], times, debug)
    assert finding.passed, finding.criteria
    assert "a synchronize per step" not in " ".join(finding.notes)
    debug["error"] = "called a synchronizing CUDA operation"
    caught = timing_check.judge("CNN", 0.01, [0.0100] * 9, [0.0101] * 9, [0.0100], times, debug)
    assert not caught.passed
    assert "called a synchronizing CUDA operation" in [c.measured for c in caught.criteria]


# -- the dashboard ---------------------------------------------------------------------------


def test_the_dashboard_fails_when_it_maps_libcuda_even_where_pids_are_hidden():
    finding = dashboard_check.judge(
        live=True,
        job_pid=100,
        dashboard={200},
        before={7: 900 * MIB},  # the host's pid of the job: another PID namespace
        seen=[{7: 900 * MIB}] * 3,
        libraries=["200: libcuda.so.1"],
        job_libraries=["100: libcuda.so.1"],
        apps=[{"pid": 7, "name": "python", "used_mib": 900.0}],
        quit_code=0,
    )
    ok = verdicts(finding)
    assert ok["the dashboard's processes in NVML's process list"] is None
    assert ok["processes on the GPU while the dashboard ran"] is True
    assert ok["CUDA libraries mapped in the dashboard's processes"] is False
    assert not finding.passed
    assert finding.tables[0].rows == [["7", "python", "900 MiB", "other"]]


# -- pytest -m gpu ---------------------------------------------------------------------------


def test_pytest_outcomes_from_junit(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_devices" name="test_gpu" time="2.5"/>'
        '<testcase classname="tests.test_noise" name="test_sync[per_example]" time="1.0">'
        '<failure message="RuntimeError: called a synchronizing CUDA operation">tb</failure>'
        "</testcase>"
        '<testcase classname="tests.test_noise" name="test_x" time="0">'
        '<skipped message="needs a CUDA device"/></testcase>'
        "</testsuite></testsuites>"
    )
    assert pytest_check.outcomes(junit) == [
        ("tests.test_devices::test_gpu", "passed", 2.5, ""),
        (
            "tests.test_noise::test_sync[per_example]",
            "failed",
            1.0,
            "RuntimeError: called a synchronizing CUDA operation",
        ),
        ("tests.test_noise::test_x", "skipped", 0.0, "needs a CUDA device"),
    ]
