"""Every GPU path of bsmon, checked on a real GPU, in one command and under 12½ minutes.

    python benchmarks/gpu_check.py --out DIR [--only NAME ...]

Runs each check (``--list`` names them) in a fresh process within its time budget, prints
one report, and writes it to DIR as gpu-report.md (for docs/gpu-report.md) and
gpu-report.json, with each check's output in DIR/logs. A check that fails, crashes or runs
out of time is reported as failed with its reason; the others still run. Exit code 0 when
every check passed, 1 otherwise. On a machine without a GPU it says so in one line and
exits 0. See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from gpucheck import environment, report
from gpucheck.checks import CHECKS
from gpucheck.runner import run_check


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="where to write the report and the logs")
    parser.add_argument("--only", nargs="+", choices=[c.name for c in CHECKS], metavar="NAME")
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    args = parser.parse_args(argv)
    if not args.list and args.out is None:
        parser.error("--out DIR is required")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for check in CHECKS:
            print(f"{check.name:<10} {check.budget_s:>4.0f} s  {check.title}")
        return 0
    reason = environment.no_gpu_reason()
    if reason is not None:
        print(f"gpu_check: no GPU to check here: {reason}.")
        return 0
    selected = [c for c in CHECKS if not args.only or c.name in args.only]
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        device = environment.describe()
    except Exception as exc:  # the report still says what it can
        device = {"device": f"not described ({type(exc).__name__}: {exc})"}
    started_at = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    started = time.monotonic()
    results = []
    for index, check in enumerate(selected, 1):
        print(
            f"[{index}/{len(selected)}] {check.title} (up to {check.budget_s:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
        result = run_check(check, args.out / "logs")
        verdict = "passed" if result.passed else "FAILED: " + "; ".join(result.failures())
        print(f"    {verdict} ({result.duration_s:.0f} s)", file=sys.stderr, flush=True)
        results.append(result)
    full = report.Report(device, started_at, time.monotonic() - started, results)
    markdown = report.to_markdown(full)
    (args.out / "gpu-report.md").write_text(markdown)
    (args.out / "gpu-report.json").write_text(report.to_json(full))
    print(markdown)
    print(f"written: {args.out / 'gpu-report.md'}, {args.out / 'gpu-report.json'}", file=sys.stderr)
    return 0 if full.passed else 1


if __name__ == "__main__":
    sys.exit(main())
