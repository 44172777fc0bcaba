"""The GPU check's results and its report, as Markdown (for docs/gpu-report.md) and JSON.

Pure data and text: nothing here imports torch or touches a device, so the report can be
assembled and tested anywhere.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Criterion:
    """One thing a check measured against its goal; ``ok`` is None for a figure shown
    for information only."""

    what: str
    measured: str
    goal: str
    ok: bool | None


@dataclass
class Table:
    columns: list[str]
    rows: list[list[str]]
    title: str = ""


def missed(criteria: list[Criterion]) -> list[str]:
    """The subjects (the text before the colon) of the criteria that failed."""
    return [c.what.split(":")[0] for c in criteria if c.ok is False]


@dataclass
class Finding:
    """What a check function returns: its criteria, tables, figures and notes."""

    summary: str
    criteria: list[Criterion] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    reason: str | None = None  # why the check could not finish (it failed)

    @property
    def passed(self) -> bool:
        return (
            self.reason is None
            and any(c.ok for c in self.criteria)
            and all(c.ok is not False for c in self.criteria)
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        return cls(
            summary=data["summary"],
            criteria=[Criterion(**c) for c in data.get("criteria", [])],
            tables=[Table(**t) for t in data.get("tables", [])],
            figures=dict(data.get("figures", {})),
            notes=list(data.get("notes", [])),
            reason=data.get("reason"),
        )


@dataclass
class CheckResult:
    name: str
    title: str
    goal: str
    budget_s: float
    duration_s: float
    finding: Finding

    @property
    def passed(self) -> bool:
        return self.finding.passed

    def failures(self) -> list[str]:
        """Why it failed, one line each (empty when it passed)."""
        out = [self.finding.reason] if self.finding.reason else []
        out += [
            f"{c.what}: {c.measured} (goal {c.goal})"
            for c in self.finding.criteria
            if c.ok is False
        ]
        if not out and not self.passed:
            out.append("no criterion was measured")
        return out


@dataclass
class Report:
    device: dict[str, str]
    started: str
    duration_s: float
    checks: list[CheckResult]

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)


# -- JSON ----------------------------------------------------------------------------------


def to_json(report: Report) -> str:
    data = {
        "passed": report.passed,
        "device": report.device,
        "started": report.started,
        "duration_s": round(report.duration_s, 1),
        "checks": [
            {
                "name": c.name,
                "title": c.title,
                "goal": c.goal,
                "passed": c.passed,
                "failures": c.failures(),
                "budget_s": c.budget_s,
                "duration_s": round(c.duration_s, 1),
                **c.finding.to_dict(),
            }
            for c in report.checks
        ],
    }
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def from_json(text: str) -> Report:
    data = json.loads(text)
    checks = [
        CheckResult(
            name=c["name"],
            title=c["title"],
            goal=c["goal"],
            budget_s=c["budget_s"],
            duration_s=c["duration_s"],
            finding=Finding.from_dict(c),
        )
        for c in data["checks"]
    ]
    return Report(data["device"], data["started"], data["duration_s"], checks)


# -- Markdown ------------------------------------------------------------------------------


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(columns: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(_cell(c) for c in columns) + " |"]
    lines.append("|" + "---|" * len(columns))
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return lines


def verdict(ok: bool | None) -> str:
    return {True: "pass", False: "**FAIL**", None: "—"}[ok]


def minutes(seconds: float) -> str:
    return (
        f"{int(seconds // 60)} min {seconds % 60:02.0f} s" if seconds >= 60 else f"{seconds:.0f} s"
    )


def to_markdown(report: Report) -> str:
    device = report.device
    passed = sum(c.passed for c in report.checks)
    budget = sum(c.budget_s for c in report.checks)
    lines = [
        "# GPU report",
        "",
        "Made by `python benchmarks/gpu_check.py --out DIR` "
        f"on {report.started}: every GPU path of bsmon, checked on a real GPU (what each "
        "check does and what pass means: [benchmarks.md](benchmarks.md#every-gpu-path-in-one-"
        "command--benchmarksgpu_checkpy)).",
        "",
        "| | |",
        "|---|---|",
        *(f"| {_cell(k)} | {_cell(v)} |" for k, v in device.items()),
        "",
        f"**{passed} of {len(report.checks)} checks passed** in {minutes(report.duration_s)} "
        f"(budget {minutes(budget)}).",
        "",
    ]
    overview = [
        [c.title, verdict(c.passed), minutes(c.duration_s), minutes(c.budget_s), c.finding.summary]
        for c in report.checks
    ]
    lines += markdown_table(["check", "result", "time", "budget", "summary"], overview)
    for check in report.checks:
        lines += ["", *section(check)]
    return "\n".join(lines) + "\n"


def section(check: CheckResult) -> list[str]:
    finding = check.finding
    lines = [f"## {check.title} — {'passed' if check.passed else 'FAILED'}", ""]
    lines += [f"Pass means: {check.goal}", ""]
    if not check.passed:
        lines += ["Why it failed:", "", *(f"- {why}" for why in check.failures()), ""]
    if finding.criteria:
        rows = [[c.what, c.measured, c.goal, verdict(c.ok)] for c in finding.criteria]
        lines += [*markdown_table(["criterion", "measured", "goal", "result"], rows), ""]
    for table in finding.tables:
        if table.title:
            lines += [f"{table.title}:", ""]
        lines += [*markdown_table(table.columns, table.rows), ""]
    if finding.notes:
        lines += [*(f"- {note}" for note in finding.notes), ""]
    lines.append(f"Time: {minutes(check.duration_s)} of its {minutes(check.budget_s)} budget.")
    return lines
