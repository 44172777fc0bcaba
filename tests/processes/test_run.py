"""`bsmon run`: an unmodified script (and torchrun's workers) watched through the socket, exit
codes and signals passed through, wrong arguments refused in one line."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from bsmon.probes.launch import autoattach
from bsmon.probes.launch import environment as launch
from bsmon.probes.launch import notes as run_notes
from bsmon.probes.wire import discovery, protocol
from bsmon.probes.wire.client import JobConnection
from bsmon.tui.cli.run import exit_status, keep_beside_record

from ..helpers import ROOT, interruptible, wait_until
from ..watch import events_of, job_socket, kill_run_processes, metrics_until

JOB = str(ROOT / "tests" / "zero_code_job.py")
BSMON = [sys.executable, "-m", "bsmon.tui.cli"]


@pytest.fixture(autouse=True)
def no_strays(bsmon_dir):
    """Whatever a test leaves running under `bsmon run` (torchrun's workers run in sessions
    of their own, out of reach of the process-group cleanup) is killed after it."""
    yield
    kill_run_processes(bsmon_dir)


def bsmon_run(processes, *args: str, **kwargs) -> subprocess.Popen:
    kwargs.setdefault("text", True)
    kwargs.setdefault("stdin", subprocess.PIPE)
    return processes.start([*BSMON, "run", *args], cwd=ROOT, **kwargs)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_an_unmodified_script_is_watched_and_its_exit_code_returned(bsmon_dir, processes):
    run = bsmon_run(processes, "--headless", "--name", "zc", "--", sys.executable, JOB, "20", "3")
    assert run.stdout.readline().strip() == "trained"  # the script's own output passes through
    with JobConnection(job_socket("zc", bsmon_dir)) as conn:
        hello = conn.hello()
        backlog = conn.messages(0.5)
        metrics = metrics_until(conn, lambda m: m.step == 20)
    assert hello.session.name == "zc" and hello.session.argv[0] == JOB
    assert hello.session.zero_code  # the dashboard words its hints for bsmon run
    assert metrics.batch_size == 8  # read from the script's DataLoader
    assert metrics.samples == 20 * 8  # the validation batches (32) between epochs not counted
    assert metrics.samples_per_s and metrics.samples_per_s > 0
    cap = hello.capabilities["set_batch_size"]
    assert not cap.available and "bsmon run --resizable makes" in cap.reason
    probe = hello.capabilities["probe"]
    assert not probe.available and "loss_fn" in probe.reason
    zero_code = [e for e in events_of(backlog) if e.kind == "zero_code"]
    assert zero_code and "SGD" in zero_code[0].message and "Net (" in zero_code[0].message
    assert zero_code[0].data["model"] == "Net"
    points = [m for m in backlog if isinstance(m, protocol.History)]
    assert points  # the history is there for a monitor that attaches late
    assert run.communicate("\n", timeout=60)[0] == ""
    assert run.returncode == 3


def test_ctrl_c_to_bsmon_run_reaches_the_script(bsmon_dir, processes):
    """Without a terminal to deliver it, bsmon run passes SIGINT on (SIGTERM: the torchrun
    and tmux tests)."""
    args = ("--headless", "--name", "sig", "--", sys.executable, JOB, "3", "0")
    run = bsmon_run(processes, *args, preexec_fn=interruptible)
    assert run.stdout.readline().strip() == "trained"
    job_socket("sig", bsmon_dir)
    (child,) = psutil.Process(run.pid).children()
    run.send_signal(signal.SIGINT)
    run.wait(60)  # stdin stays open: the script ends by the signal or not at all
    err = run.stderr.read()
    assert run.returncode == 128 + signal.SIGINT  # as a shell reports it
    assert gone(child.pid)
    assert "KeyboardInterrupt" in err  # the script saw Ctrl-C, as it would without bsmon


def test_a_script_that_crashes_at_import_fails_as_it_would_without_bsmon(
    bsmon_dir, processes, tmp_path
):
    script = tmp_path / "broken.py"
    script.write_text("import torch\nimport no_such_module_for_bsmon\n")
    run = bsmon_run(processes, "--headless", "--", sys.executable, str(script))
    out, err = run.communicate(timeout=120)
    assert run.returncode == 1
    assert "ModuleNotFoundError: No module named 'no_such_module_for_bsmon'" in err
    # the script's own output, then one line from bsmon run saying why nothing was monitored
    lines = err.replace("no_such_module_for_bsmon", "").splitlines()
    assert [line for line in lines if "bsmon" in line] == [lines[-1]]
    assert lines[-1] == "bsmon: broken was not monitored: " + autoattach.NOTHING_TRAINED
    assert out == "" and not list(bsmon_dir.glob("*.sock"))


def test_torchrun_workers_each_serve_a_socket(bsmon_dir, processes):
    run = bsmon_run(
        processes,
        "--headless",
        "--name",
        "ddp",
        "--",
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(ROOT / "examples" / "ddp_torchrun.py"),
        "--steps",
        "0",
    )
    hellos, steps = [], []
    for name in ("ddp", "ddp-rank1"):
        with JobConnection(job_socket(name, bsmon_dir, timeout=120)) as conn:
            hellos.append(conn.hello())
            steps.append(metrics_until(conn, lambda m: m.step >= 5 and m.samples > 0).step)
    assert [(h.session.rank, h.session.world_size) for h in hellos] == [(0, 2), (1, 2)]
    assert all(s >= 5 for s in steps)
    workers = [h.session.pid for h in hellos]
    assert all(pid != run.pid for pid in workers)  # the workers, not the launcher, serve
    run.send_signal(signal.SIGTERM)  # passed on to torchrun, which stops its workers
    run.communicate(timeout=120)
    assert run.returncode != 0
    wait_until(lambda: all(gone(pid) for pid in workers), timeout=60, message="workers to stop")


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        ([], 2, "run needs a command"),
        (["--"], 2, "run needs a command"),
        (["--name", " ", "--", "python"], 2, "--name must not be empty"),
        (["--bogus", "--", "python"], 2, "unrecognized arguments: --bogus"),
        (["--", "no-such-command-for-bsmon"], 127, "command not found"),
        (["--log", "/no/such/dir/x.log", "--", "python"], 2, "cannot write the log"),
    ],
)
def test_wrong_run_arguments_are_one_line(bsmon_dir, args, code, message):
    result = subprocess.run(
        [*BSMON, "run", *args], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert result.returncode == code
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bsmon: ") and message in lines[0]
    assert result.stdout == ""


def test_the_start_up_hook_chains_and_never_breaks_the_child(tmp_path):
    """The sitecustomize bsmon shadows still runs; a Python without bsmon only gets a warning;
    a process that never imports torch never loads bsmon."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("print('the other sitecustomize ran')\n")
    env = launch.child_environment(os.environ, "hook", tmp_path, "run-1")
    env["PYTHONPATH"] += os.pathsep + str(other)
    probe = "import sys; print('bsmon' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.stdout.splitlines() == ["the other sitecustomize ran", "False"]
    assert result.stderr == ""
    no_bsmon = "import sys; sys.modules['bsmon'] = None; import torch; print('trained')"
    result = subprocess.run(
        [sys.executable, "-c", no_bsmon], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and result.stdout.splitlines()[-1] == "trained"
    assert "cannot import bsmon" in result.stderr and "runs unmonitored" in result.stderr


@pytest.mark.parametrize(
    ("command", "name"),
    [
        (["python", "train.py", "--lr", "3"], "train"),
        (["/usr/bin/python3.11", "-u", "scripts/fit.py"], "fit"),
        (["torchrun", "--nproc-per-node", "2", "ddp.py"], "ddp"),
        (["python", "-m", "torch.distributed.run", "--standalone", "a/b.py"], "b"),
        (["python", "-m", "pkg.train", "--config", "x.py"], "train"),
        (["./run.sh", "x.py"], "run.sh"),
        (["fabric", "run", "--strategy", "ddp", "train_fabric.py"], "train_fabric"),
    ],
)
def test_job_names_come_from_the_script(command, name):
    assert launch.job_name(command) == name


def test_the_child_environment_puts_the_hook_first(tmp_path):
    env = launch.child_environment({"PYTHONPATH": "/a:/b", "HOME": "/h"}, "n", tmp_path, "r")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(launch.BOOT_DIR), "/a", "/b"]
    assert (launch.BOOT_DIR / "sitecustomize.py").is_file()
    assert env[launch.ENV_RUN] == "n" and env["BSMON_DIR"] == str(tmp_path) and env["HOME"] == "/h"
    assert launch.log_name("a/b c") == "a_b_c"


def test_the_child_keeps_its_records_where_the_shell_would_not_in_the_socket_directory(tmp_path):
    """The job's BSMON_DIR is the socket directory (a tmpfs emptied at logout, or /tmp); its
    records go where the shell that ran bsmon run keeps them."""
    sockets = tmp_path / "sockets"
    env = launch.child_environment({"HOME": "/h"}, "n", sockets, "r")
    assert env["BSMON_RECORDS_DIR"] == "/h/.local/share/bsmon/records"
    assert discovery.records_dir(env) == Path("/h/.local/share/bsmon/records")
    env = launch.child_environment({"HOME": "/h", "XDG_DATA_HOME": "/d"}, "n", sockets, "r")
    assert discovery.records_dir(env) == Path("/d/bsmon/records")
    env = launch.child_environment({"HOME": "/h", "BSMON_DIR": "/mine"}, "n", sockets, "r")
    assert discovery.records_dir(env) == Path("/mine/records")
    assert env["BSMON_DIR"] == str(sockets)


def test_a_job_under_bsmon_run_leaves_its_record_in_the_data_directory(
    bsmon_dir, processes, tmp_path, monkeypatch
):
    """No BSMON_DIR, sockets in $XDG_RUNTIME_DIR (emptied at logout): the record is written to
    $XDG_DATA_HOME/bsmon/records, where `bsmon records` in the same shell finds it."""
    monkeypatch.delenv("BSMON_DIR")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(bsmon_dir))  # short: socket paths are limited
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    lines = run_to_a_file(processes, tmp_path / "out.txt", "kept", "5", "0", code=0)
    (record,) = (tmp_path / "data" / "bsmon" / "records").glob("*-kept-*.jsonl")
    assert lines[-1].startswith(f"bsmon: the record of kept: {record} ")
    assert not list(bsmon_dir.rglob("*.jsonl"))
    listed = subprocess.run([*BSMON, "records"], capture_output=True, text=True, timeout=60)
    assert record.name in listed.stdout


def test_a_log_that_cannot_move_beside_its_record_stays_where_it_is(tmp_path):
    log = tmp_path / "train-7.log"
    log.write_text("epoch 0\n")
    record = tmp_path / "gone" / "20261201-140335-train-7.jsonl"  # its directory went away
    assert keep_beside_record(log, [str(record)]) == log and log.read_text() == "epoch 0\n"
    assert keep_beside_record(log, []) == log  # not monitored: no record
    record.parent.mkdir()
    assert keep_beside_record(log, [str(record)]) == record.with_suffix(".log")
    assert record.with_suffix(".log").read_text() == "epoch 0\n" and not log.exists()


def test_exit_status_is_what_a_shell_shows():
    assert [exit_status(c) for c in (0, 3, -signal.SIGTERM)] == [0, 3, 143]


def test_the_notes_of_a_run_say_why_nothing_is_monitored(tmp_path):
    note = run_notes.Note
    run_notes.write(tmp_path, "r1", note(1, attached=False, trained=False, reason="launcher"))
    run_notes.write(tmp_path, "r1", note(2, attached=False, trained=True, reason="by hand"))
    run_notes.write(tmp_path, "other", note(3, attached=True, trained=True))
    (tmp_path / "notes" / "r1-9.json").write_text("{not json")  # skipped, not fatal
    assert run_notes.why_unmonitored(run_notes.read(tmp_path, "r1")) == "by hand"
    assert run_notes.why_unmonitored(run_notes.read(tmp_path, "other")) is None
    assert "stepped a torch.optim optimizer" in run_notes.why_unmonitored([])
    run_notes.clear(tmp_path, "r1")
    assert run_notes.read(tmp_path, "r1") == [] and run_notes.read(tmp_path, "other")


def test_a_job_killed_after_attaching_is_not_called_unmonitored(bsmon_dir, processes):
    run = bsmon_run(
        processes, "--headless", "--name", "killed", "--", sys.executable, JOB, "3", "0"
    )
    assert run.stdout.readline().strip() == "trained"
    job_socket("killed", bsmon_dir)
    (child,) = psutil.Process(run.pid).children()
    child.kill()  # no atexit, no last word
    run.wait(60)
    assert run.returncode == 128 + signal.SIGKILL
    assert "not monitored" not in run.stderr.read()


def run_to_a_file(processes, log, name: str, *job_args: str, code: int) -> list[str]:
    """``bsmon run --name NAME -- python JOB ARGS`` with stdout and stderr to ``log`` (no
    terminal): it ends with the job's ``code``, and not one escape code is in the log."""
    with open(log, "w") as out:
        run = processes.start(
            [*BSMON, "run", "--name", name, "--", sys.executable, JOB, *job_args],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        assert run.wait(120) == code
    text = log.read_text()
    assert "\x1b" not in text
    return text.splitlines()


def test_without_a_terminal_it_runs_headless_says_so_and_ends_with_the_job(
    bsmon_dir, processes, tmp_path
):
    """nohup, sbatch, CI, `> log`: no screen codes in the log, and bsmon run ends when the job
    does, with its code and where its record is."""
    lines = run_to_a_file(processes, tmp_path / "out.txt", "nt", "5", "3", code=3)
    assert (
        lines[0]
        == "bsmon: stdout is not a terminal: running nt headless (`bsmon attach nt` shows it)"
    )
    assert "trained" in lines
    (record,) = (bsmon_dir / "records").glob("*.jsonl")
    assert lines[-1] == f"bsmon: the record of nt: {record} (`bsmon replay` or `bsmon export` it)"


def test_ctrl_c_before_the_first_step_says_interrupted_not_nothing_trained(
    bsmon_dir, processes, tmp_path
):
    script = tmp_path / "slow.py"
    script.write_text("import time\nprint('ready', flush=True)\ntime.sleep(600)\nimport torch\n")
    run = bsmon_run(
        processes, "--headless", "--", sys.executable, str(script), preexec_fn=interruptible
    )
    assert run.stdout.readline().strip() == "ready"
    run.send_signal(signal.SIGINT)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 128 + signal.SIGINT
    assert err.splitlines()[-1] == (
        "bsmon: slow was not monitored: it was interrupted (Ctrl-C) before bsmon attached at "
        "its first optimizer step"
    )


COUNT_JOB = str(ROOT / "tests" / "signal_count_job.py")


def counted(log: Path) -> collections.Counter:
    """The signals the counting job noted in ``log``."""
    lines = log.read_text().splitlines() if log.exists() else []
    return collections.Counter(line for line in lines if line.startswith("SIG"))


def signals_reaching_the_job(
    processes, tmp_path, send: Callable[[int], None], fence: signal.Signals
) -> collections.Counter:
    """What the counting job got under ``bsmon run --headless`` without a terminal, after
    ``send(pid of bsmon run)`` and then ``fence`` sent to bsmon run alone. bsmon run passes
    signals on in the order it handles them, the lower number first, as the job does: with
    a fence numbered above the signal sent, a duplicate passed on is counted before the
    fence."""
    log = tmp_path / "signals.txt"
    run = bsmon_run(processes, "--headless", "--", sys.executable, COUNT_JOB, str(log))
    assert run.stdout.readline().strip() == "ready"
    send(run.pid)
    os.kill(run.pid, fence)
    wait_until(lambda: counted(log)[fence.name], timeout=60, message=f"the job to get {fence}")
    run.stdin.close()
    assert run.wait(60) == 0  # the job's own exit code
    return counted(log)


def as_gnu_timeout_does(signum: int) -> Callable[[int], None]:
    """``timeout -s SIG``: the signal to the command, then at once to its whole group."""

    def send(pid: int) -> None:
        os.kill(pid, signum)
        os.killpg(pid, signum)

    return send


@pytest.mark.parametrize(
    "send",
    [
        pytest.param(lambda pid: os.killpg(pid, signal.SIGINT), id="to-the-group"),
        pytest.param(lambda pid: os.kill(pid, signal.SIGINT), id="to-bsmon-run-alone"),
        pytest.param(as_gnu_timeout_does(signal.SIGINT), id="to-both-at-once"),
    ],
)
def test_a_sigint_reaches_the_job_once_whoever_it_was_sent_to(processes, tmp_path, send):
    """`timeout -s INT`, `kill -INT -- -PGID`, a batch system: a signal sent to the process
    group bsmon run is in reaches the job once, as it would without bsmon (it used to get it
    twice: directly and passed on), and so does one sent to bsmon run alone."""
    got = signals_reaching_the_job(processes, tmp_path, send, fence=signal.SIGTERM)
    assert got == {"SIGINT": 1, "SIGTERM": 1}


@pytest.mark.parametrize(
    "send",
    [
        pytest.param(lambda pid: os.killpg(pid, signal.SIGTERM), id="to-the-group"),
        pytest.param(lambda pid: os.kill(pid, signal.SIGTERM), id="to-bsmon-run-alone"),
    ],
)
def test_a_sigterm_reaches_the_job_once_whoever_it_was_sent_to(processes, tmp_path, send):
    got = signals_reaching_the_job(processes, tmp_path, send, fence=signal.SIGINT)
    assert got == {"SIGTERM": 1, "SIGINT": 1}
