"""The package layout contract: import boundaries and the pyproject package list."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import tomllib

from ..helpers import ROOT


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


FACES = {
    "bsmon.probes",  # attach, __version__
    "bsmon.probes.demo",  # bsmon demo runs the demo job
    "bsmon.probes.wire",
    "bsmon.probes.wire.protocol",
    "bsmon.probes.record",
    "bsmon.probes.summary",
    "bsmon.probes.launch",  # bsmon run
    "bsmon.probes.units",  # one number formatter for the screen and the summary
}


def package_modules() -> dict[str, Path]:
    """Every module of bsmon.probes and bsmon.tui by its import name."""
    modules = {}
    for package, directory in (("bsmon.probes", "probes"), ("bsmon.tui", "tui")):
        for path in (ROOT / directory).rglob("*.py"):
            parts = list(path.relative_to(ROOT / directory).with_suffix("").parts)
            if "boot" in parts:  # the start-up hook is not imported as part of the package
                continue
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([package, *parts])] = path
    return modules


def import_statements(
    name: str, path: Path, top_level_only: bool, typing: bool = True
) -> list[tuple[str, list[str]]]:
    """Each import of module ``name`` as (the module imported from, by absolute name, the
    names taken from it: none for ``import a``); with ``top_level_only``, not the imports
    inside functions or under TYPE_CHECKING; without ``typing``, not those under
    TYPE_CHECKING (which never run)."""
    tree = ast.parse(path.read_text())
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    nodes = tree.body if top_level_only else list(_walk(tree, typing))
    found = []
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            found.append((target, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
    return found


def _walk(node: ast.AST, typing: bool) -> Iterator[ast.AST]:
    """``ast.walk``, leaving out what is under ``if TYPE_CHECKING:`` unless ``typing``."""
    yield node
    for child in ast.iter_child_nodes(node):
        if not typing and isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            continue
        yield from _walk(child, typing)


def imports_of(
    name: str, path: Path, top_level_only: bool, names: bool = True, typing: bool = True
) -> set[str]:
    """The modules ``name`` imports, by absolute name: with ``names``, ``from a import b`` gives
    a.b as well as a (b may be a module); with ``top_level_only``, not the imports inside
    functions or under TYPE_CHECKING; without ``typing``, not those under TYPE_CHECKING."""
    found = set()
    for target, taken in import_statements(name, path, top_level_only, typing):
        found.add(target)
        if names:
            found.update(f"{target}.{one}" for one in taken)
    return found


def test_the_dashboard_imports_only_the_faces_of_probes():
    """tui/ takes what it needs from a wing's face (``from bsmon.probes.record import ...``),
    never from the modules behind it."""
    modules = package_modules()
    for name, path in modules.items():
        if not name.startswith("bsmon.tui"):
            continue
        for imported in imports_of(name, path, top_level_only=False, names=False):
            if imported.startswith("bsmon.probes") and imported in modules:
                assert imported in FACES, f"{path.relative_to(ROOT)} imports {imported}"


def test_no_import_cycles():
    """Counting the imports inside functions too: one that is put off to run later still
    closes a circle (runtime/logged -> service -> telemetry -> logged did, through two
    imports inside functions). Not those under TYPE_CHECKING, which never run: the
    composition root (agent/assemble) names the Monitor it fills in only as a type."""
    modules = package_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        imported = imports_of(name, path, top_level_only=False, typing=False)
        imported = {m for m in imported if m in modules}
        parents = {  # importing a.b.c runs a.b's __init__ first
            ".".join(m.split(".")[:n]) for m in imported for n in range(2, m.count(".") + 1)
        }
        graph[name] = {m for m in imported | parents if m in modules and not name.startswith(m)}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycle = [*path[path.index(name) :], name]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if name in done:
            return
        for dependency in sorted(graph[name]):
            visit(dependency, [*path, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


# The floors of bsmon.probes, lowest first (docs/architecture.md): a module imports from its
# own floor and those below. A wing (package) or a top-level module each; "" is the package's
# own __init__ (attach, __version__).
FLOORS = {
    "wire": 1,
    "units": 1,
    "version": 1,
    "runtime": 2,
    "anatomy": 3,
    "batch": 3,
    "noise": 3,
    "throughput": 3,
    "record": 4,
    "maxbatch": 4,
    "options": 4,
    "agent": 5,
    "summary": 5,
    "integrations": 6,
    "demo": 6,
    "": 6,
    "launch": 7,
}
# The imports that still run back up a floor: 13 before issue 44 moved the types home.
# Telemetry still computes the step anatomy's phases and keeps the metrics history.
UPWARD = {
    ("bsmon.probes.runtime.steps", "bsmon.probes.anatomy.seconds"),  # StepDone.phases, typing
    ("bsmon.probes.runtime.telemetry", "bsmon.probes.anatomy.marks"),
    ("bsmon.probes.runtime.telemetry", "bsmon.probes.anatomy.phases"),
    ("bsmon.probes.runtime.telemetry", "bsmon.probes.anatomy.seconds"),
    ("bsmon.probes.runtime.telemetry", "bsmon.probes.anatomy.window"),
    ("bsmon.probes.runtime.telemetry", "bsmon.probes.record.history"),
}


def floor_of(module: str) -> int:
    room = module.split(".")[2] if module.count(".") > 1 else ""
    assert room in FLOORS, f"{module}: give bsmon.probes.{room} a floor in FLOORS"
    return FLOORS[room]


def test_few_imports_run_back_up_a_floor():
    """Every import in bsmon.probes (inside functions and under TYPE_CHECKING too) goes to
    its own floor or one below, but for the few in ``UPWARD``. ``from a import b`` imports
    a.b when b is a module, else a."""
    modules = package_modules()
    upward = set()
    for name, path in modules.items():
        if not name.startswith("bsmon.probes"):
            continue
        for target, taken in import_statements(name, path, top_level_only=False):
            submodules = [f"{target}.{one}" for one in taken if f"{target}.{one}" in modules]
            for imported in submodules or [target]:
                if imported in modules and floor_of(imported) > floor_of(name):
                    upward.add((name, imported))
    assert not upward - UPWARD, f"imports that run back up a floor: {sorted(upward - UPWARD)}"
    assert not UPWARD - upward, f"gone: take them out of UPWARD: {sorted(UPWARD - upward)}"


def test_the_benchmarks_never_import_the_tests():
    """The jobs both run live in workloads/; a test reaches a benchmark's module only through
    tests/gpu_check_kit.py, so the two trees do not depend on each other."""
    for path in (ROOT / "benchmarks").rglob("*.py"):
        for target, _ in import_statements(path.stem, path, top_level_only=False):
            assert target.split(".")[0] != "tests", f"{path.relative_to(ROOT)} imports {target}"


LONG_MODULE = 420  # lines


def test_a_long_module_says_why_it_is_one_module():
    for path in package_modules().values():
        lines = path.read_text().count("\n")
        if lines > LONG_MODULE:
            docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
            assert "Why one module:" in docstring, f"{path.relative_to(ROOT)}: {lines} lines"


def test_every_wing_lists_its_modules():
    """A wing's package docstring names each of its modules (a newcomer's map of the wing)."""
    for init in (ROOT / "probes").glob("*/__init__.py"):
        docstring = ast.get_docstring(ast.parse(init.read_text())) or ""
        for module in init.parent.glob("*.py"):
            if module.name != "__init__.py":
                assert f"``{module.stem}``" in docstring, f"{init.parent.name}/{module.name}"
