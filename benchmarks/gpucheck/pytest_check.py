"""``pytest -m gpu``: the test suite's GPU tests, on this GPU, with each test's result."""

from __future__ import annotations

import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from .procs import ROOT, Children, Deadline
from .report import Criterion, Finding, Table


def outcomes(junit: Path) -> list[tuple[str, str, float, str]]:
    """(test id, passed|failed|error|skipped, seconds, message) of each test in a JUnit file."""
    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            element = case.find(kind)
            if element is not None:
                outcome = {"failure": "failed"}.get(kind, kind)
                message = (element.get("message") or element.text or "").strip().splitlines()
                message = message[0][:200] if message else ""
                break
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        out.append((test, outcome, float(case.get("time") or 0), message))
    return out


def gpu_test_files() -> list[str]:
    """The test modules with a gpu mark (collecting only those saves importing the rest)."""
    return sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").rglob("test_*.py")
        if "mark.gpu" in path.read_text()
    )


def run(deadline: Deadline) -> Finding:
    with tempfile.TemporaryDirectory(prefix="bsm-gpu-pytest-") as work, Children() as children:
        junit = Path(work) / "junit.xml"
        args = ["-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
        files = gpu_test_files()
        process = children.start([sys.executable, *args, *files], cwd=str(ROOT), stdout=None)
        code = children.wait(process, max(5.0, deadline.remaining() - 2))
        tests = outcomes(junit) if junit.exists() else []
    counts = {
        kind: sum(t[1] == kind for t in tests) for kind in ("passed", "failed", "error", "skipped")
    }
    tally = ", ".join(f"{n} {kind}" for kind, n in counts.items() if n) or "no tests"
    criteria = [
        Criterion(
            "tests marked gpu that ran",
            tally,
            "≥ 1, every one passed (none skipped)",
            bool(tests) and counts["passed"] == len(tests),
        ),
        Criterion("pytest's exit code", str(code), "0", code == 0),
    ]
    rows = [
        [test, outcome, f"{seconds:.1f} s", message] for test, outcome, seconds, message in tests
    ]
    return Finding(
        summary=tally,
        criteria=criteria,
        tables=[Table(["test", "result", "time", "message"], rows)],
        figures={"exit_code": code, "files": files, **counts},
    )
