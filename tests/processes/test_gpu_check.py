"""benchmarks/gpu_check.py without a GPU: the one-line exit, the report from recorded
results, the runner's handling of checks that fail, crash or overrun, and each check's
verdict on recorded readings."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import types

import psutil
import pytest
import torch

from ..gpu_check_kit import BENCHMARKS  # puts benchmarks/ on the import path
from ..helpers import ROOT

# isort: split
from gpucheck import environment, report
from gpucheck.checks import CHECKS, TOTAL_BUDGET_S
from gpucheck.runner import Check, run_check

FIXTURE = ROOT / "tests" / "gpu_check_report.json"
FAKES_PATH = {"PYTHONPATH": os.pathsep.join([str(BENCHMARKS), str(ROOT)])}


# -- no GPU ----------------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the command runs every check")
def test_without_a_gpu_it_says_so_in_one_line_and_exits_0(tmp_path):
    out = tmp_path / "report"
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / "gpu_check.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert len(result.stdout.splitlines()) == 1
    assert result.stdout.startswith("gpu_check: no GPU to check here: ")
    assert not out.exists()


def fake_nvml(count: int | Exception) -> types.SimpleNamespace:
    def init() -> None:
        if isinstance(count, Exception):
            raise count

    return types.SimpleNamespace(
        nvmlInit=init, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: count
    )


def test_each_missing_piece_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(OSError("libnvidia-ml.so.1 missing")))
    assert environment.no_gpu_reason() == "NVML is not loadable (libnvidia-ml.so.1 missing)"
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(0))
    assert environment.no_gpu_reason() == "NVML sees no GPU"
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(1))
    monkeypatch.setattr(torch.version, "cuda", None)
    assert environment.no_gpu_reason() == f"torch {torch.__version__} is a build without CUDA"
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert environment.no_gpu_reason() == f"torch {torch.__version__} sees no CUDA device"


# -- the report, from recorded results -------------------------------------------------------


def recorded() -> report.Report:
    return report.from_json(FIXTURE.read_text())


def table_rows(markdown: str) -> dict[str, list[str]]:
    """Every Markdown table row by its first cell."""
    rows = {}
    for line in markdown.splitlines():
        if line.startswith("| ") and not line.startswith("| ---"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows.setdefault(cells[0], cells)
    return rows


def test_the_markdown_report_from_recorded_results():
    markdown = report.to_markdown(recorded())
    lines = markdown.splitlines()
    assert lines[0] == "# GPU report"
    assert "on 2025-01-01 12:00 UTC" in lines[2]
    assert "**4 of 6 checks passed** in 7 min 02 s (budget 8 min 50 s)." in lines
    rows = table_rows(markdown)
    assert rows["GPUs"] == ["GPUs", "0: NVIDIA H100 80GB HBM3 (80 GiB)"]
    assert rows["NVML readings against nvidia-smi"][1:4] == ["pass", "22 s", "40 s"]
    assert rows["The noise scale's cost with CUDA"][1] == "**FAIL**"
    assert rows["The dashboard creates no CUDA context"][1:] == [
        "**FAIL**",
        "3 s",
        "40 s",
        "crashed",
    ]
    assert rows["mlp: noise scale at its default budget / agent alone"] == [
        "mlp: noise scale at its default budget / agent alone",
        "1.048",
        "≤ 1.03",
        "**FAIL**",
    ]
    assert rows["control: one synchronize per step / none"][-1] == "—"  # information only
    assert rows["resnet"][-1] == "486 fits, 538 OOM, 512 OOM, 499 fits, 505 fits, 508 OOM"


def test_each_section_says_what_pass_means_and_why_it_failed():
    markdown = report.to_markdown(recorded())
    sections = markdown.split("\n## ")[1:]
    assert [s.splitlines()[0] for s in sections] == [
        "NVML readings against nvidia-smi — passed",
        "CUDA-event step times; no synchronization on the training thread — passed",
        "The probe against the real out-of-memory boundary — passed",
        "The noise scale's cost with CUDA — FAILED",
        "The dashboard creates no CUDA context — FAILED",
        "pytest -m gpu — passed",
    ]
    nvml, _, _, noise, dashboard, _ = sections
    assert "Pass means: the readings match nvidia-smi at the same moments." in nvml
    assert "Why it failed" not in nvml
    assert "Readings of GPU-1234 (NVIDIA H100 80GB HBM3):" in nvml
    assert "- nvidia-smi runs as soon as a message is taken." in nvml
    assert (
        "Why it failed:\n\n- mlp: noise scale at its default budget / agent alone: 1.048 "
        "(goal ≤ 1.03)\n" in noise
    )
    assert "- the check's process was killed by SIGKILL without a result: Traceback" in dashboard
    assert "Time: 3 s of its 40 s budget." in dashboard


def test_every_markdown_table_has_as_many_cells_in_each_row_as_in_its_header():
    tables: list[list[int]] = [[]]
    for line in report.to_markdown(recorded()).splitlines():
        if line.startswith("|"):
            tables[-1].append(line.replace("\\|", "").count("|"))
        elif tables[-1]:
            tables.append([])
    tables = [t for t in tables if t]
    assert len(tables) == 10
    assert all(len(set(t)) == 1 for t in tables), tables


def test_a_pipe_in_a_cell_is_escaped():
    lines = report.markdown_table(["a", "b"], [["x | y", "z"]])
    assert lines[-1] == "| x \\| y | z |"


def test_the_json_report_is_the_recorded_one_and_round_trips():
    text = report.to_json(recorded())
    assert json.loads(text) == json.loads(FIXTURE.read_text())
    assert report.from_json(text) == recorded()
    data = json.loads(text)
    assert data["passed"] is False
    assert [(c["name"], c["passed"]) for c in data["checks"]] == [
        ("nvml", True),
        ("timing", True),
        ("probe", True),
        ("noise", False),
        ("dashboard", False),
        ("pytest", True),
    ]


def test_a_finding_passes_with_a_passing_criterion_and_none_failing():
    def finding(*oks: bool | None, reason: str | None = None) -> report.Finding:
        criteria = [report.Criterion("c", "m", "g", ok) for ok in oks]
        return report.Finding("s", criteria=criteria, reason=reason)

    assert finding(True, None).passed
    assert not finding().passed  # nothing measured
    assert not finding(None).passed  # information only
    assert not finding(True, False).passed
    assert not finding(True, reason="over its budget").passed


# -- the checks and the runner ---------------------------------------------------------------


def test_the_budgets_add_up_to_under_twelve_and_a_half_minutes_and_every_check_resolves():
    assert sum(c.budget_s for c in CHECKS) < TOTAL_BUDGET_S == 750
    assert len({c.name for c in CHECKS}) == len(CHECKS) == 8
    for check in CHECKS:
        module, _, function = check.target.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), check.target
        assert check.goal.endswith("."), check.name


def test_the_probe_checks_budget_holds_its_searches_at_their_most_trials():
    """The jobs and the probes (68 s on the H100, 80 planned), then every search at its most
    trials and one trial per model for the recommendation, at 10 s a trial (9–11 s there),
    within the probe check's budget less the runner's grace."""
    from gpucheck import probe_check
    from gpucheck.runner import GRACE_S

    budget = next(c.budget_s for c in CHECKS if c.name == "probe")
    models, what_ifs = len(probe_check.MODELS), len(probe_check.WHAT_IFS)
    trials = models * (probe_check.PREDICTION_RUNS + 1) + models * what_ifs * (
        probe_check.WHAT_IF_RUNS
    )
    assert trials == 30
    assert 80 + trials * probe_check.TRIAL_S <= budget - GRACE_S - 30  # 30 s to spare


def fake(name: str, budget: float = 30) -> Check:
    return Check(name, f"fake {name}", budget, "it works.", f"tests.gpu_check_kit:{name}")


def test_a_passing_check_gets_its_budget_less_a_grace(tmp_path):
    result = run_check(fake("passes"), tmp_path / "logs", FAKES_PATH)
    assert result.passed, result.finding
    assert result.finding.summary == "fine, 25 s planned"
    assert result.duration_s < 30
    assert (tmp_path / "logs" / "passes.log").exists()


def test_a_check_that_raises_fails_with_its_reason(tmp_path):
    result = run_check(fake("raises"), tmp_path / "logs", FAKES_PATH)
    assert not result.passed
    assert result.finding.reason == "ValueError: the device went away"
    assert result.failures() == ["ValueError: the device went away"]
    assert "Traceback" in (tmp_path / "logs" / "raises.log").read_text()


def test_a_check_killed_by_a_signal_is_reported_as_crashed(tmp_path):
    result = run_check(fake("killed"), tmp_path / "logs", FAKES_PATH)
    assert not result.passed
    assert result.finding.summary == "crashed"
    assert result.finding.reason.startswith("the check's process was killed by SIGKILL")


def test_a_check_over_its_budget_is_stopped_with_everything_it_started(tmp_path):
    pid_file = tmp_path / "sleeper.pid"
    env = {**FAKES_PATH, "GPU_CHECK_FAKE_PID_FILE": str(pid_file)}
    result = run_check(fake("overruns", budget=3), tmp_path / "logs", env)
    assert not result.passed
    assert result.finding.reason.startswith("still running after its 3 s budget; stopped")
    assert 3 <= result.duration_s < 20
    sleeper = int(pid_file.read_text())
    try:
        status = psutil.Process(sleeper).status()
    except psutil.NoSuchProcess:
        status = "gone"
    assert status in ("gone", psutil.STATUS_ZOMBIE)


def test_the_anatomy_check_on_a_cpu():
    """The anatomy check's own method, run where it can be: the CNN on the CPU, a round of a
    window of ordinary steps and one of synchronized steps (synchronize is a no-op here:
    wall time per phase), then the profiler's pass, which sees no kernel on a CPU. Each
    phase's share by the anatomy of the synchronized steps is within 5 points of their own
    clock (the same steps: a busy machine moves both alike); the ordinary steps' shares are
    compared too (other steps: on a GPU they are the verdict).

    Batch 16, a step of about 20 ms here: the anatomy's optimizer phase runs from its pre-hook
    to its post-hook, the clock's from the call to its return, and the 150-250 µs between
    (torch's wrapper around ``step``, about 70 µs bare, and the hooks' own work) is about 1
    point of such a step, 3 points of batch 4's 6 ms, where a busy CI machine once took it
    past 5 (5.07)."""
    from gpucheck import anatomy_check

    measured = anatomy_check.measure("cpu", batch=16, rounds=1, profiled_steps=3)
    assert measured["window_steps"] == [anatomy_check.STEPS] * 2  # each window, its block
    assert measured["synchronized"]["steps"] == anatomy_check.STEPS
    assert measured["kernels"] == dict.fromkeys(anatomy_check.PHASES, 0.0)
    clock, itself = (anatomy_check.shares(measured[k]) for k in ("synchronized", "self"))
    assert clock["backward"] > 20  # backward seen: on a CPU, its own thread or not
    assert 99 < sum(clock.values()) <= 100 + 1e-9  # the phases tile the step
    for phase in anatomy_check.PHASES:
        assert abs(itself[phase] - clock[phase]) <= anatomy_check.GOAL_POINTS, (itself, clock)
    criteria, rows = anatomy_check.compare(measured)
    assert [row[0] for row in rows] == list(anatomy_check.PHASES)
    assert [c.ok is None for c in criteria] == [False, False, False, True]


def test_the_mfu_check_on_a_cpu_with_a_peak_given(monkeypatch):
    """The MFU check's own method where it can run: on a CPU the agent has no peak, so one is
    given (1 TFLOP/s); the agent's FLOPs per token then match the hand count within 5% (a
    count, not a timing), and its MFU and the hand count's are both figures."""
    from gpucheck import mfu_check

    from bsmon.probes.throughput import extension

    monkeypatch.setattr(extension, "_device_peak", lambda _device, _dtype: (1e12, None, "test"))
    shape = mfu_check.Shape(layers=2, width=64, context=32, vocab=256, heads=4)
    measured = mfu_check.measure("cpu", batch=4, steps=3, warmup=2, shape=shape)
    agent = measured["agent"]
    per_token = agent["flops_per_sample"] / shape.context
    assert per_token == pytest.approx(measured["hand_flops_per_token"], rel=mfu_check.GOAL)
    assert agent["dtype"] == "bf16" and agent["mfu"] > 0 and measured["hand_mfu"] > 0
    first = mfu_check.criteria_of(measured)[0]
    assert first.what == "the agent's MFU against a hand count" and first.ok is not None
