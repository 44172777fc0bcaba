"""``python -m gpucheck.run MODULE:FUNCTION BUDGET_S RESULT``: one check, in its own process.

The function gets a ``Deadline`` and returns a ``Finding``; an exception becomes a failed
finding with its reason. The finding is written to RESULT as JSON. The runner (runner.py)
kills this process and everything it started when the budget is spent.
"""

from __future__ import annotations

import importlib
import json
import sys
import traceback
from pathlib import Path

from .procs import Deadline
from .report import Finding

REASON_CHARS = 500


def run_target(target: str, deadline: Deadline) -> Finding:
    module, _, function = target.partition(":")
    try:
        return getattr(importlib.import_module(module), function)(deadline)
    except Exception as exc:
        traceback.print_exc()
        text = f"{type(exc).__name__}: {exc}"
        return Finding(summary=f"crashed ({type(exc).__name__})", reason=text[:REASON_CHARS])


def main(argv: list[str] | None = None) -> int:
    target, budget, result = sys.argv[1:] if argv is None else argv
    finding = run_target(target, Deadline(float(budget)))
    Path(result).write_text(json.dumps(finding.to_dict(), ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
