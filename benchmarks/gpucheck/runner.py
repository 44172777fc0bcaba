"""Runs each check in a fresh process with its time budget, and turns whatever happens —
a finding, a crash, a signal, a budget overrun — into a ``CheckResult``."""

from __future__ import annotations

import json
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .procs import Children, child_env
from .report import CheckResult, Finding

GRACE_S = 5.0  # the check plans to end this long before it is killed


@dataclass(frozen=True)
class Check:
    name: str
    title: str
    budget_s: float
    goal: str  # what "pass" means, in a sentence
    target: str  # "module:function", called with a Deadline, returning a Finding


def run_check(check: Check, logs: Path, env: dict[str, str] | None = None) -> CheckResult:
    """Run ``check`` in a child process; its output goes to ``logs/NAME.log``."""
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{check.name}.log"
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="bsm-gpu-", dir="/tmp") as work,
        Children() as children,
        open(log_path, "wb") as log,
    ):
        result = Path(work) / "finding.json"
        process = children.python(
            "-m",
            "gpucheck.run",
            check.target,
            str(max(1.0, check.budget_s - GRACE_S)),
            str(result),
            env={**child_env(BSMON_DIR=work), **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(Path(work)),
            start_new_session=True,
        )
        try:
            code = children.wait(process, check.budget_s)
        except TimeoutError:
            finding = Finding(
                summary="over its time budget",
                reason=f"still running after its {check.budget_s:.0f} s budget; stopped "
                f"(its output: {log_path})",
            )
        else:
            finding = read_finding(result, code, log_path)
    return CheckResult(
        name=check.name,
        title=check.title,
        goal=check.goal,
        budget_s=check.budget_s,
        duration_s=time.monotonic() - started,
        finding=finding,
    )


def read_finding(path: Path, code: int, log_path: Path) -> Finding:
    if path.exists():
        try:
            return Finding.from_dict(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError) as exc:
            return Finding(summary="unreadable result", reason=f"its result is unreadable: {exc}")
    if code < 0:
        try:
            how = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"was killed by signal {-code}"
    else:
        how = f"exited with code {code}"
    last = last_line(log_path)
    return Finding(
        summary="crashed",
        reason=f"the check's process {how} without a result" + (f": {last}" if last else ""),
    )


def last_line(path: Path) -> str:
    try:
        lines = path.read_bytes()[-4000:].decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""
