"""Security: nothing on the socket path unpickles, a pickle sent to it is just bad input, and the
probe's recipe (the only pickle bsmon writes) is a private file that is removed.

A peer of another uid, the socket and directory modes, and an unsafe BSMON_DIR are proved in
test_server.py, test_discovery.py and test_cli.py (see docs/reliability.md)."""

from __future__ import annotations

import ast
import itertools
import os
import pickle
import stat
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
import torch

from bsmon.probes import attach
from bsmon.probes.maxbatch import recipe as recipes
from bsmon.probes.record.writer import RecordWriter
from bsmon.probes.summary import build as summary_build
from bsmon.probes.wire import discovery, protocol
from bsmon.probes.wire.client import JobConnection

from ..helpers import ROOT
from ..jobs import TinyJob
from ..records import START, two_phase

# Everything that reads bytes from a socket or a record: every module of bsmon but the
# max-batch probe's (the sidecar reads the recipe, a private file the job wrote, never the
# socket).
SOCKET_PATH_MODULES = [
    path
    for path in sorted([*(ROOT / "probes").rglob("*.py"), *(ROOT / "tui").rglob("*.py")])
    if "maxbatch" not in path.parts
]
UNPICKLERS = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve", "joblib"}


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
        elif (
            isinstance(node, ast.Attribute)
            and node.attr in ("load", "loads")
            and isinstance(node.value, ast.Name)
            and node.value.id == "torch"
        ):
            names.add("torch.load")
    return names


def test_no_module_on_the_socket_or_record_path_can_unpickle():
    assert len(SOCKET_PATH_MODULES) > 40
    offenders = {
        path.relative_to(ROOT).as_posix(): sorted(found)
        for path in SOCKET_PATH_MODULES
        if (found := imported_modules(path) & (UNPICKLERS | {"torch.load"}))
    }
    assert offenders == {}


def test_a_pickle_sent_to_the_socket_is_refused_as_not_json(bsmon_dir, tmp_path):
    job = TinyJob()
    canary = tmp_path / "unpickled"

    class Exploit:
        def __reduce__(self):
            return (canary.touch, ())

    payload = pickle.dumps(Exploit(), protocol=0).replace(b"\n", b" ")
    mon = attach(job.model, job.optimizer, batch_size=8, record=False)
    with mon, JobConnection(mon.socket_path) as conn:
        conn.hello()
        conn.send_raw(payload + b"\n")
        reply = conn.wait_for(protocol.Reply)
        assert not reply.ok and "not valid JSON" in reply.error
    assert not canary.exists()


def test_the_probe_recipe_is_a_private_file_in_the_private_directory(bsmon_dir):
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    cls, kwargs, groups = recipes.optimizer_spec(optimizer, model)
    recipe = recipes.Recipe(
        model=recipes.pickle_structure(model),
        optimizer_class=cls,
        optimizer_kwargs=kwargs,
        param_groups=groups,
        batch=(torch.zeros(2, 4), torch.zeros(2, 1)),
        batch_size=2,
        device="cpu",
        job_batch_size=2,
    )
    path = recipes.write(recipe, bsmon_dir)
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    finally:
        path.unlink()


def test_the_unpickler_check_would_see_one():
    assert "cloudpickle" in imported_modules(ROOT / "probes" / "maxbatch" / "recipe.py")


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to make a directory another uid owns")
def test_a_bsmon_dir_owned_by_someone_else_is_refused_by_the_command_line(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    result = subprocess.run(
        [sys.executable, "-m", "bsmon.tui.cli", "list"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "BSMON_DIR": str(theirs)},
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "belongs to uid 65534, not to you" in result.stderr
    assert "set BSMON_DIR to a directory you own" in result.stderr


UMASK_JOB = """
import os, torch
os.umask(0)
from bsmon.probes import attach
m = torch.nn.Linear(4, 1)
o = torch.optim.SGD(m.parameters(), lr=0.01)
with attach(m, o, batch_size=8, name="umask") as mon:
    for _ in range(5):
        m(torch.randn(8, 4)).sum().backward(); o.step(); o.zero_grad()
print(mon.session.record)
"""


def test_under_umask_000_the_directories_bsmon_makes_on_the_way_are_private(bsmon_dir, tmp_path):
    """A fresh HOME, no BSMON_DIR: ~/.local and ~/.local/share were made 0777 under umask 000,
    and another user could swap ~/.local/share/bsmon under a running job."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BSMON_", "XDG_"))}
    env.update(HOME=str(home), XDG_RUNTIME_DIR=str(bsmon_dir))
    result = subprocess.run(
        [sys.executable, "-c", UMASK_JOB], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr
    record = Path(result.stdout.strip())
    assert record.parent == home / ".local" / "share" / "bsmon" / "records"
    made = [home / ".local", *(p for p in record.parents if home / ".local" in p.parents)]
    assert {str(p.relative_to(home)): mode(p) for p in made} == {
        str(p.relative_to(home)): 0o700 for p in made
    }
    summaries = list(record.parent.glob("*.summary.*"))
    assert len(summaries) == 2
    assert [mode(p) for p in (record, *summaries)] == [0o600] * 3


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def planted_links(directory: Path, target: Path, names: list[str]) -> list[Path]:
    links = [directory / f".{name}.planted.tmp" for name in names]
    for link in links:
        link.symlink_to(target)
    return links


def test_a_link_planted_at_a_temporary_name_is_never_written_through(tmp_path, monkeypatch):
    """The record's compaction and its summary wrote their temporary files with O_TRUNC
    through whatever was at a predictable name: a planted link made a job overwrite its
    user's ~/.bashrc. A temporary is now a new file (O_EXCL|O_NOFOLLOW) under a fresh name."""
    target = tmp_path / "bashrc"
    target.write_text("the user's own\n")
    records = tmp_path / "records"
    records.mkdir(mode=0o700)
    record = records / "run.jsonl"
    json_path, md_path = summary_build.paths_beside(record)
    links = planted_links(records, target, [record.name, json_path.name, md_path.name])
    # and at the names bsmon used to use, which anyone could predict
    for name in (f"{record.name}.tmp", f".{json_path.name}.{os.getpid()}.tmp"):
        (records / name).symlink_to(target)
        links.append(records / name)
    tokens = itertools.cycle(["planted", "fresh"])  # each write meets a link first
    monkeypatch.setattr(discovery, "_temp_token", lambda: next(tokens), raising=False)
    writer = RecordWriter(record, pytest.fail, start=START, bucket_s=0.5, per_level=4)
    writer.start()
    for line in two_phase().lines():
        span = line.startswith(b'{"type":"span"')
        writer.put(line, msgspec.json.decode(line)["t1"] if span else None)
    assert writer.finish(timeout=60) and writer.compactions > 0
    summary_build.write_summary_beside(record)
    assert target.read_text() == "the user's own\n"
    assert all(link.is_symlink() and link.resolve() == target for link in links)
    assert summary_build.summarize_record(record).run.complete
    assert [mode(p) for p in (record, json_path, md_path)] == [0o600] * 3
    assert sorted(p.name for p in records.iterdir() if not p.is_symlink()) == sorted(
        [record.name, json_path.name, md_path.name]
    )


def test_when_every_temporary_name_is_taken_the_write_fails_saying_so(tmp_path, monkeypatch):
    target = tmp_path / "bashrc"
    target.write_text("the user's own\n")
    json_path = tmp_path / "run.summary.json"
    planted_links(tmp_path, target, [json_path.name])
    monkeypatch.setattr(discovery, "_temp_token", lambda: "planted")
    with pytest.raises(FileExistsError, match=r"temporary names beside run\.summary\.json"):
        discovery.replace_atomically(json_path, b"{}")
    assert target.read_text() == "the user's own\n" and not json_path.exists()
