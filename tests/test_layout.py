"""The package layout contract: import boundaries and the pyproject package list."""

from __future__ import annotations

import subprocess
import sys

import tomllib

from .helpers import ROOT


def imported_modules(code: str) -> set[str]:
    probe = f"{code}\nimport sys\nprint('\\n'.join(sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    return set(result.stdout.split())


def test_probes_never_import_textual_or_rich():
    modules = imported_modules(
        "import bsmon.probes, bsmon.probes.agent, bsmon.probes.demo, bsmon.probes.wire.client"
    )
    assert not {m for m in modules if m.split(".")[0] in ("textual", "rich", "textual_plotext")}


def test_probes_source_has_no_ui_imports():
    for path in (ROOT / "probes").rglob("*.py"):
        for line in path.read_text().splitlines():
            stripped = line.strip()
            assert not stripped.startswith(
                ("import textual", "from textual", "import rich", "from rich")
            ), f"{path}: {line}"


def test_the_dashboard_does_not_import_torch():
    modules = imported_modules("import bsmon.tui.app, bsmon.tui.cli")
    assert "torch" not in modules


def test_every_package_directory_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    mapping = config["tool"]["setuptools"]["package-dir"]
    found = set()
    for package, directory in mapping.items():
        for init in (ROOT / directory).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / directory)
            found.add(".".join([package, *relative.parts]))
    assert found == listed


def test_ci_runs_the_readme_test_command():
    result = subprocess.run(
        ["bash", ".ci/run", "--print"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    readme = (ROOT / "README.md").read_text()
    echoed = next(line for line in result.stdout.splitlines() if line.startswith("+ "))
    assert echoed[2:] in readme
    assert "pytest" in echoed and "pip install" in echoed
