"""`bsmon demo` in a real terminal: the screen updates, q and Ctrl-C quit and say where the
record is, nothing is left running."""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil

from ..helpers import ROOT, wait_until
from ..tmux import Tmux


def step_on_screen(text: str) -> int | None:
    match = re.search(r"step ([\d,]+)", text)
    return int(match.group(1).replace(",", "")) if match else None


def demo_processes(bsmon_dir: Path) -> list[psutil.Process]:
    """The demo jobs of this test (its BSMON_DIR): other suites on the machine run demos too."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if "bsmon.probes.demo" in cmdline:
            with contextlib.suppress(psutil.Error):
                if proc.environ().get("BSMON_DIR") == str(bsmon_dir):
                    found.append(proc)
    return found


@contextlib.contextmanager
def demo_in_tmux(bsmon_dir: Path, size: tuple[int, int], options: str = "") -> Iterator[Tmux]:
    """`bsmon demo` in a private tmux of ``size``; killed afterwards with any demo job left."""
    tmux = Tmux(*size)
    bsmon = Path(sys.executable).with_name("bsmon")
    env = {"BSMON_DIR": str(bsmon_dir), "LANG": "C.UTF-8", "TERM": "xterm-256color"}
    try:
        tmux.start(f"{bsmon} demo {options}", ROOT, env)
        yield tmux
    finally:
        tmux.kill()
        for proc in demo_processes(bsmon_dir):
            proc.kill()


def test_demo_in_tmux_updates_and_quits_cleanly(bsmon_dir):
    with demo_in_tmux(bsmon_dir, (100, 30)) as tmux:
        first = tmux.wait_for(
            lambda s: "LIVE" in s and (step_on_screen(s) or 0) > 0,
            what="the live dashboard with a step count",
        )
        for title in ("Devices", "Batch", "Noise scale", "Events", "Step time", "Loss"):
            assert title in first
        assert "n/a" in first  # no GPU here, and the panel says why
        step1 = step_on_screen(first)
        later = tmux.wait_for(
            lambda s: (step_on_screen(s) or 0) > step1, timeout=30, what="the step count to grow"
        )
        assert "samples/s" in later
        tmux.send("+")
        tmux.wait_for(
            lambda s: "64→128" in s and re.search(r"batch\s+128", s),
            timeout=30,
            what="the batch size to go 64 → 128 after +",
        )
        tmux.send("-")
        tmux.wait_for(
            lambda s: "128→64" in s and re.search(r"batch\s+64\b", s),
            timeout=30,
            what="the batch size to go back to 64 after -",
        )
        tmux.send("q")
        screen = tmux.wait_for(lambda s: "BSMON-EXITED-0" in s, timeout=30, what="exit 0")
        said = re.search(r"the record of demo: (\S+\.jsonl)", screen.replace("\n", ""))
        assert said and Path(said.group(1)).parent == bsmon_dir / "records"  # it says where
        wait_until(
            lambda: not demo_processes(bsmon_dir),
            interval=0.1,
            message="the demo job to stop (it was left running)",
        )
        assert not list(bsmon_dir.glob("*.sock"))


def test_at_80x24_events_are_readable_l_expands_them_and_keys_say_why(bsmon_dir):
    """A real 80×24 terminal: the Events panel shows whole event lines, `l` puts it over the
    screen, `]` changes the refresh interval, `r` on a one-process job says why it is off."""
    with demo_in_tmux(bsmon_dir, (80, 24), "--interval 0.5") as tmux:
        event = re.compile(r"│ \d+:\d\d:\d\d step \d+ [•▲✖] ")  # time, step, mark, text
        first = tmux.wait_for(
            lambda s: "LIVE" in s and "╭─ Events" in s, what="the dashboard with its Events panel"
        )
        assert re.search(r"q\s+Quit", first.splitlines()[-1]), first  # on the footer at 80
        tmux.send("l")
        expanded = tmux.wait_for(
            lambda s: "Events" in s and "Step time" not in s and event.search(s),
            timeout=20,
            what="event lines over the whole screen",
        )
        assert "Devices" not in expanded
        tmux.send("Escape")
        tmux.wait_for(lambda s: "Step time" in s, timeout=20, what="the dashboard back")
        tmux.send("]")
        tmux.wait_for(lambda s: "redraws every 1 s" in s, timeout=20, what="the interval toast")
        tmux.send("r")
        tmux.wait_for(lambda s: "r is off" in s, timeout=20, what="why r is off")
        tmux.send("C-c")  # Ctrl-C quits, as in every terminal monitor
        tmux.wait_for(lambda s: "BSMON-EXITED-0" in s, timeout=30, what="bsmon to exit with 0")


def test_a_switches_the_autopilot_on_in_a_real_terminal(bsmon_dir):
    """`a` in a real 80×24 terminal: the job's reply as a toast, the Batch panel's line."""
    with demo_in_tmux(bsmon_dir, (80, 24)) as tmux:
        tmux.wait_for(lambda s: "LIVE" in s and "speed" in s, timeout=60, what="steps")
        tmux.send("a")
        screen = tmux.wait_for(lambda s: "auto    on" in s, timeout=20, what="the autopilot on")
        assert re.search(r"a\s+Auto", screen.splitlines()[-1]), screen
        tmux.send("C-c")
        tmux.wait_for(lambda s: "BSMON-EXITED-0" in s, timeout=30, what="bsmon to exit with 0")
