"""Each GPU check's verdict on recorded readings: what passes, what fails, and what is only
reported (no GPU needed: the readings are given)."""

from __future__ import annotations

from bsmon.probes.wire.protocol import Capability, DeviceReading, ProbePoint, ProbeResult, WhatIf

from ..gpu_check_kit import BENCHMARKS  # noqa: F401 (puts benchmarks/ on the import path)

# isort: split
from gpucheck import dashboard_check, nvml_check, probe_check, pytest_check, timing_check
from probe_accuracy import Search as Bracket

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


def probe_run(boundary: int, bf16_boundary: int) -> probe_check.ModelRun:
    result = ProbeResult(
        status="ok",
        max_batch_size=450,
        points=[ProbePoint(batch_size=b, fits=True) for b in (128, 300, 450)],
        predicted_max=486,
        what_ifs=[
            WhatIf("bf16 autocast", 900, measured=True),
            WhatIf("activation checkpointing", None, measured=False, note="not Sequential"),
        ],
    )
    run = probe_check.ModelRun("resnet", result=result)
    run.job = {
        "steps_per_s_before": 20.0,
        "steps_per_s_during": 12.0,
        "memory_fit": [1 * GIB, 20 * MIB],
        "errors": 0,
    }
    base = probe_check.Search("as is", 512)
    base.outcome = Bracket(boundary, boundary + 1, [], converged=True)
    base.trials = [{"batch": boundary, "fits": True, "peak_allocated": GIB + boundary * 21 * MIB}]
    bf16 = probe_check.Search("bf16 autocast", 900)
    bf16.outcome = Bracket(bf16_boundary, bf16_boundary + 20, [], converged=True)
    run.searches = {"as is": base, "bf16 autocast": bf16}
    return run


def test_probe_predictions_within_their_goals_pass():
    finding = probe_check.judge([probe_run(505, 870)], notes=[])
    ok = verdicts(finding)
    assert finding.passed, finding.criteria
    assert ok["resnet: predicted largest batch vs the real boundary"] is True
    assert ok["resnet: activation checkpointing what-if"] is None  # not measured
    memory = "resnet: the job's memory model at the largest size that fit"
    assert next(c.measured for c in finding.criteria if c.what == memory).endswith("(-4.3%)")
    speed = next(c for c in finding.criteria if c.what.endswith("while the probe ran"))
    assert speed.measured == "0.60× (20.0 → 12.0 steps/s)"


def test_a_prediction_above_the_boundary_or_a_what_if_off_by_more_than_10_percent_fails():
    finding = probe_check.judge([probe_run(470, 780)], notes=[])
    ok = verdicts(finding)
    # 512 is +8.9% over 470, and with the margin 486 would not fit
    assert ok["resnet: predicted largest batch vs the real boundary"] is False
    assert ok["resnet: bf16 autocast what-if vs its real boundary"] is False  # +15.4%
    assert finding.summary.startswith("2 criteria off")


def test_an_unfinished_search_fails_with_its_bracket():
    run = probe_run(505, 870)
    run.searches["as is"].outcome = Bracket(505, 560, [], converged=False)
    criterion = probe_check.model_criteria(run)[1]
    assert criterion.ok is False
    assert criterion.measured == "512; the boundary is between 505 and 560 after 1 runs"


def test_the_search_around_a_prediction_takes_few_trials():
    for truth, trials in ((1020, 7), (960, 7), (800, 8)):
        tried: list[int] = []

        def fits(size: int, truth: int = truth, tried: list[int] = tried) -> bool:
            tried.append(size)
            return size <= truth

        found = probe_check.search_around(fits, 1000, 600, 0.05, 0.005, 9)
        assert found.converged and truth - 5 <= found.boundary <= truth, (truth, tried)
        assert len(tried) == trials, tried


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
