"""``benchmarks/`` on the import path (its modules are scripts' helpers, not installed): the
one way a test reaches a benchmark's module (the jobs both run are in ``workloads/``, and
benchmarks/ never imports tests/: tests/unit/test_layout.py). And, for the GPU check's tests,
stand-in checks for the runner — one passes, one raises, one is killed by a signal, one
overruns its budget with a descendant in a session of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

from gpucheck.procs import Deadline  # noqa: E402
from gpucheck.report import Criterion, Finding  # noqa: E402


def passes(deadline: Deadline) -> Finding:
    return Finding(
        summary=f"fine, {deadline.budget_s:.0f} s planned",
        criteria=[Criterion("a figure", "1.00", "≤ 1.01", True)],
    )


def raises(deadline: Deadline) -> Finding:
    raise ValueError("the device went away")


def killed(deadline: Deadline) -> Finding:
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


def overruns(deadline: Deadline) -> Finding:
    """Starts a descendant that escapes the process group (as the probe's sidecar does),
    writes its pid where the test can see it, and never returns."""
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True
    )
    Path(os.environ["GPU_CHECK_FAKE_PID_FILE"]).write_text(str(sleeper.pid))
    while True:
        time.sleep(1)
