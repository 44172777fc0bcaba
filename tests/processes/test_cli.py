"""The command line: listing jobs, the headless demo, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bsmon.tui.cli import parser as cli

from ..helpers import wait_until

JOB_SCRIPT = """
import sys, time, torch
from bsmon.probes import attach
m = torch.nn.Linear(2, 1)
o = torch.optim.SGD(m.parameters(), lr=0.1)
mon = attach(m, o, batch_size=4, name=sys.argv[1])
for _ in range(7):
    m(torch.randn(4, 2)).sum().backward(); o.step(); o.zero_grad()
mon.flush()
print("ready", flush=True)
time.sleep(120)
"""


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bsmon.tui.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_list_json_shows_a_running_job_with_its_socket(bsmon_dir, processes):
    job = processes.python("-c", JOB_SCRIPT, "lister", text=True)
    assert job.stdout.readline().strip() == "ready"
    result = run_cli("list", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    (entry,) = data["jobs"]
    assert entry["name"] == "lister" and entry["pid"] == job.pid
    assert entry["socket"].endswith(f"{job.pid}.sock") and entry["step"] == 7
    text = run_cli("list")
    assert "lister" in text.stdout and str(job.pid) in text.stdout and " 7 " in text.stdout


def test_list_removes_sockets_of_dead_jobs(bsmon_dir, processes):
    job = processes.python("-c", JOB_SCRIPT, "doomed", text=True)
    assert job.stdout.readline().strip() == "ready"
    job.kill()
    job.wait(10)
    assert list(bsmon_dir.glob("*.sock"))  # SIGKILL left the socket behind
    data = json.loads(run_cli("list", "--json").stdout)
    assert data["jobs"] == []
    assert not list(bsmon_dir.glob("*.sock"))


def test_list_with_no_jobs_says_how_to_start_one(bsmon_dir):
    result = run_cli("list")
    assert result.returncode == 0 and "bsmon demo" in result.stdout
    assert "`bsmon run -- python train.py`" in result.stdout  # the path with no code change


@pytest.mark.parametrize(
    "args",
    [
        ["--bogus"],
        ["attach"],
        ["frobnicate"],
        ["demo", "--steps", "many"],
        ["list", "--json", "extra"],
    ],
)
def test_wrong_arguments_are_one_line_and_exit_2(args, bsmon_dir):
    result = run_cli(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bsmon: ")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "points_to"),
    [
        (["--bogus"], "`bsmon --help`"),
        (["run", "--bogus", "--", "true"], "`bsmon run --help`"),
        (["run", "--grace", "abc", "--", "true"], "`bsmon run --help`"),
        (["list", "--interval", "2"], "`bsmon list --help`"),
        (["probe", "job", "--interval", "2"], "`bsmon probe --help`"),
    ],
)
def test_a_wrong_argument_points_to_the_help_of_its_own_command(args, points_to, capsys):
    assert cli.main(args) == 2
    assert capsys.readouterr().err.strip().endswith(f"(see {points_to})")


def test_attach_to_an_unknown_job_is_a_clear_error(bsmon_dir):
    result = run_cli("attach", "nobody")
    assert result.returncode == 1
    assert result.stderr.strip() == "bsmon: no running job named 'nobody'; running jobs: none"


def test_an_unsafe_bsmon_dir_is_refused_with_exit_2(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    result = run_cli("--dir", str(link), "list")
    assert result.returncode == 2 and "symbolic link" in result.stderr
    assert "Traceback" not in result.stderr


def test_headless_demo_trains_for_the_steps_asked(bsmon_dir):
    result = subprocess.run(
        [sys.executable, "-m", "bsmon.tui.cli", "demo", "--headless", "--steps", "30"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "demo: training on cpu" in result.stdout
    assert not list(bsmon_dir.glob("*.sock"))


def test_version_flag():
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0


def test_demo_job_is_visible_while_it_runs(bsmon_dir, processes):
    job = processes.python(
        "-m", "bsmon.probes.demo", "--steps", "0", "--name", "visible", "--report-every", "0"
    )
    wait_until(
        lambda: list(bsmon_dir.glob(f"{job.pid}.sock")), timeout=60, message="the demo job's socket"
    )
    data = json.loads(run_cli("list", "--json").stdout)
    assert [j["name"] for j in data["jobs"]] == ["visible"]


def test_the_demo_job_stops_when_bsmon_is_killed(bsmon_dir, processes):
    """A dropped SSH session kills `bsmon demo` with SIGHUP/SIGKILL; its job must not linger."""
    parent = processes.python(
        "-c",
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-m', 'bsmon.probes.demo', '--report-every', '0',"
        " '--exit-with-parent'], start_new_session=True)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(600)\n",
        text=True,
    )
    job_pid = int(parent.stdout.readline())
    wait_until(lambda: list(bsmon_dir.glob(f"{job_pid}.sock")), timeout=60, message="job socket")
    parent.kill()
    parent.wait(10)
    wait_until(lambda: not pid_running(job_pid), timeout=30, message="the orphaned job to stop")
    assert not list(bsmon_dir.glob("*.sock"))


def pid_running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


PROBE_JOB = """
import sys, time, torch
from torch import nn
from bsmon.probes import attach
m = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
o = torch.optim.SGD(m.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(256, 16), torch.randint(0, 4, (256,)))
mon = attach(m, o, batch_size=16, max_batch_size=1024, loss_fn=nn.CrossEntropyLoss(),
             name="cli-probe")
for x, y in mon.dataloader(data):
    nn.functional.cross_entropy(m(x), y).backward(); o.step(); o.zero_grad()
mon.flush()
print("ready", flush=True)
time.sleep(300)
"""


def test_probe_command_prints_a_result_and_json(bsmon_dir, processes):
    job = processes.python("-c", PROBE_JOB, text=True)
    assert job.stdout.readline().strip() == "ready"
    result = run_cli("probe", "cli-probe", "--memory-budget", "600M", "--json", timeout=240)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["status"] == "ok" and data["max_batch_size"] >= 16
    assert data["points"][0]["batch_size"] == 16 and data["recommendation"]["batch_size"] >= 1
    text = run_cli("probe", "cli-probe", "--memory-budget", "600M", timeout=240)
    assert text.returncode == 0, text.stderr
    assert "largest batch that ran" in text.stdout and "recommended:" in text.stdout
    assert "probe: probe" not in text.stderr
    # every size measured, in the progress too: read from the points, not from whichever
    # status a tick happened to catch (a quick probe on a busy machine showed none)
    table = text.stdout.split("largest batch that ran")[0].splitlines()[1:]
    measured = [line.split()[0] for line in table if line.strip()]
    progress = [line for line in text.stderr.splitlines() if line.startswith("probe: batch ")]
    assert [line.split()[2] for line in progress] == measured, text.stderr
    assert progress[0].startswith("probe: batch 16 ran: peak ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["probe", "nobody"], "no running job named 'nobody'"),
        (["probe", "x", "--memory-budget", "lots"], "not a byte count: 'lots'"),
        (["probe", "x", "--memory-budget", "0"], "must be positive"),
        (["--readonly", "probe", "x"], "--readonly"),
    ],
)
def test_probe_command_errors_are_one_line(bsmon_dir, args, message):
    result = run_cli(*args)
    assert result.returncode in (1, 2) and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["list", "--dir", "/x", "--json"],
        ["--dir", "/x", "list", "--json"],
        ["--dir", "/elsewhere", "list", "--json", "--dir", "/x"],
    ],
)
def test_global_options_go_before_or_after_the_subcommand(argv):
    args = cli.build_parser().parse_args(argv)
    assert args.command == "list" and args.json and args.dir == Path("/x")
    assert not args.readonly


def test_readonly_after_the_subcommand_keeps_its_meaning():
    assert cli.build_parser().parse_args(["attach", "job", "--readonly"]).readonly
    assert cli.build_parser().parse_args(["--readonly", "attach", "job"]).readonly
    assert not cli.build_parser().parse_args(["attach", "job"]).readonly


def test_list_dir_after_the_subcommand_lists_that_directory(tmp_path):
    result = run_cli("list", "--dir", str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["dir"] == str(tmp_path)


def test_help_has_examples_and_each_option_says_what_it_does(capsys):
    for argv in (["--help"], ["demo", "--help"], ["export", "--help"], ["replay", "--help"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
    out = capsys.readouterr().out
    top, demo, export, replay = out.split("usage: ")[1:]
    assert "examples:" in top and "bsmon run -- python train.py" in top
    assert "the demo job's name" in demo and "the batch size it starts at" in demo
    assert "--readonly" not in export and "--dir" not in export  # they mean nothing there
    assert "--readonly" not in replay and "--interval" in replay


def test_each_command_offers_only_the_options_that_act_there(capsys):
    for argv in (["list", "--help"], ["probe", "--help"], ["attach", "--help"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
    listing, probing, attaching = capsys.readouterr().out.split("usage: ")[1:]
    assert "--dir" in listing and "--interval" not in listing and "--readonly" not in listing
    assert "--dir" in probing and "--readonly" in probing and "--interval" not in probing
    assert all(option in attaching for option in ("--dir", "--readonly", "--interval"))
