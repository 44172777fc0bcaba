"""`bsmon run` with its dashboard, in a real terminal: a live view of a script nobody changed;
`q` and Ctrl-C stop the training and return its code; `d` leaves it running while bsmon run
waits; SIGTERM stops it; a crash at import is reported at once."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil

from ..helpers import ROOT, wait_until
from ..processes.test_run import gone
from ..tmux import Tmux
from ..watch import kill_run_processes, run_processes

BSMON = f"{sys.executable} -m bsmon.tui.cli"
UNMODIFIED = f"{sys.executable} examples/unmodified.py --epochs 1000"


def start(bsmon_dir, command: str) -> Tmux:
    tmux = Tmux(100, 30)
    env = {"BSMON_DIR": str(bsmon_dir), "LANG": "C.UTF-8", "TERM": "xterm-256color"}
    tmux.start(command, ROOT, env)
    return tmux


def live_step(text: str) -> int:
    """The step the header shows once live (other panels say "step 3.2 ms": not a step count)."""
    match = re.search(r"· step ([\d,]+) ·", text)
    return int(match.group(1).replace(",", "")) if match and "LIVE" in text else 0


def job_pids(bsmon_dir, name: str) -> list[int]:
    return [
        p.pid for p in run_processes(bsmon_dir, name) if "examples/unmodified.py" in p.cmdline()
    ]


@contextlib.contextmanager
def live_run(bsmon_dir, name: str) -> Iterator[tuple[Tmux, int]]:
    """`bsmon run` of the unmodified example in tmux, once its dashboard is live: the pane and
    the training's pid. Both are gone afterwards, whatever the test did."""
    tmux = start(bsmon_dir, f"{BSMON} run --name {name} -- {UNMODIFIED}")
    try:
        tmux.wait_for(lambda s: live_step(s) > 0, what="the live dashboard")
        (pid,) = job_pids(bsmon_dir, name)
        yield tmux, pid
    finally:
        tmux.kill()
        kill_run_processes(bsmon_dir)


def test_q_stops_the_training_and_bsmon_run_returns_its_exit_code(bsmon_dir):
    with live_run(bsmon_dir, "tq") as (tmux, pid):
        screen = tmux.wait_for(lambda s: "+/- p a off — ? says why" in s, what="keys off")
        assert "tq" in screen
        tmux.send("?")  # the help opens with why the keys are off
        screen = tmux.wait_for(lambda s: "This job" in s, what="the help")
        assert "+/- is off: bsmon run leaves the script's DataLoader" in screen
        tmux.send("Escape")
        tmux.wait_for(lambda s: "Loss" in s and "loss" in s, what="the loss chart")
        wait_until(  # the script's own first line, before q stops it (a busy machine is slow)
            lambda: any("epoch 0: loss" in log.read_text() for log in bsmon_dir.glob("*.log")),
            timeout=120,
            interval=0.1,
            message="the script's first epoch line in its output",
        )
        tmux.send("q")
        # SIGINT, as Ctrl-C in a terminal: the script ends with KeyboardInterrupt (130)
        screen = tmux.wait_for(lambda s: "BSMON-EXITED-130" in s, timeout=30, what="exit 130")
        assert "stopping tq: Ctrl-C (SIGINT) sent" in screen
        assert "tq exited with code 130" in screen
        assert "the record of tq:" in screen.replace("\n", " ")
        wait_until(lambda: gone(pid), timeout=30, message="the training to stop")
        # the output moved beside the record, named with the job's pid as the record is
        joined = screen.replace("\n", "")
        record = Path(re.search(r"the record of tq: (\S+?\.jsonl)", joined).group(1))
        log = Path(re.search(r"its output: (\S+?\.log)", joined).group(1))
        assert log == record.with_suffix(".log") and log.name.endswith(f"-tq-{pid}.log")
        assert "epoch 0: loss" in log.read_text()  # the script's own output
        assert not list(bsmon_dir.glob("*.log"))  # none left in the socket directory


def test_d_detaches_bsmon_run_waits_and_ctrl_c_then_stops_the_training(bsmon_dir):
    with live_run(bsmon_dir, "td") as (tmux, pid):
        tmux.send("d")
        screen = tmux.wait_for(lambda s: "Waiting for it" in s, timeout=30, what="the detach")
        assert "bsmon attach td" in screen.replace("\n", " ")
        assert psutil.pid_exists(pid) and list(bsmon_dir.glob(f"{pid}.sock"))  # still serving
        tmux.send("C-c")  # bsmon run is the terminal's foreground now; the job has its session
        screen = tmux.wait_for(lambda s: "BSMON-EXITED-130" in s, timeout=30, what="exit 130")
        assert "stopping td: Ctrl-C (SIGINT) sent" in screen
        wait_until(lambda: gone(pid), timeout=30, message="the training to stop")


def test_sigterm_to_bsmon_run_stops_the_training_and_returns_its_code(bsmon_dir):
    with live_run(bsmon_dir, "tt") as (tmux, pid):
        psutil.Process(pid).parent().send_signal(signal.SIGTERM)
        screen = tmux.wait_for(lambda s: "BSMON-EXITED-143" in s, timeout=60, what="exit 143")
        assert "stopping tt: SIGTERM sent; SIGKILL in 10 s" in screen
        assert "tt exited with code 143" in screen
        wait_until(lambda: gone(pid), timeout=30, message="the training to stop")


def test_a_crash_at_import_closes_the_dashboard_and_shows_why(bsmon_dir, tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("import torch\nraise SystemExit('broken: no data at /nowhere')\n")
    tmux = start(bsmon_dir, f"{BSMON} run --name tc -- {sys.executable} {script}")
    try:
        screen = tmux.wait_for(lambda s: "BSMON-EXITED-1" in s, timeout=90, what="exit 1")
        assert "tc exited with code 1" in screen
        assert "| broken: no data at /nowhere" in screen
        # not monitored, no record: the output stays in the bsmon directory
        log = Path(re.search(r"its output: (\S+?\.log)", screen.replace("\n", "")).group(1))
        assert log.parent == bsmon_dir and "broken: no data" in log.read_text()
    finally:
        tmux.kill()
        kill_run_processes(bsmon_dir)


def test_the_time_view_of_an_unmodified_script_says_it_waits_for_data(bsmon_dir):
    tmux = start(bsmon_dir, f"{BSMON} run --name ta -- {sys.executable} tests/anatomy_job.py")
    try:
        verdict = re.compile(r"step\s+[\d.]+ ms · input-bound")  # the Batch panel's line
        tmux.wait_for(  # the Events panel may say "input-bound" first
            lambda s: live_step(s) > 0 and verdict.search(s),
            timeout=90,
            what="the dashboard's one-line verdict",
        )
        tmux.send("t")
        screen = tmux.wait_for(
            lambda s: "waiting for data" in s and "try:" in s, what="the time view"
        )
        assert re.search(r"input-bound: \d+% of each step waits for data", screen)
        assert "num_workers" in screen
        assert re.search(r"waiting for data\s+[\d.]+ ms\s+\d+%", screen)
        tmux.send("t")
        tmux.wait_for(lambda s: "Loss" in s, what="back on the dashboard")
        tmux.send("C-c")  # Ctrl-C quits from any screen, and stops the job
        tmux.wait_for(lambda s: "BSMON-EXITED-130" in s, timeout=30, what="bsmon to exit")
    finally:
        tmux.kill()
        kill_run_processes(bsmon_dir)


def test_ctrl_c_in_the_terminal_reaches_a_headless_job_once(bsmon_dir, tmp_path):
    """--headless in a terminal's foreground, stdout to a file: Ctrl-C reaches the job from the
    terminal and bsmon run does not pass it on again (SIGTERM, sent to bsmon run alone, is
    passed on after anything it passed on before)."""
    log = tmp_path / "signals.txt"
    job = f"{sys.executable} tests/signal_count_job.py {log}"
    tmux = start(bsmon_dir, f"{BSMON} run --headless -- {job} > {tmp_path / 'out.txt'}")
    try:
        ready = wait_until(lambda: read_lines(log), timeout=60, message="the job to be ready")
        bsmon_run_pid = int(ready[0].split()[1])
        tmux.send("C-c")
        wait_until(lambda: "SIGINT" in read_lines(log), timeout=30, message="the Ctrl-C")
        os.kill(bsmon_run_pid, signal.SIGTERM)
        wait_until(lambda: "SIGTERM" in read_lines(log), timeout=30, message="the SIGTERM")
        tmux.send("C-d")  # the job reads the terminal (it is in the foreground): end of input
        tmux.wait_for(lambda s: "BSMON-EXITED-0" in s, timeout=30, what="exit 0")
        assert read_lines(log)[1:] == ["SIGINT", "SIGTERM"]
    finally:
        tmux.kill()
        kill_run_processes(bsmon_dir)


def read_lines(path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []
