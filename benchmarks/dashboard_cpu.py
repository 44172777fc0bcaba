"""What the dashboard itself costs: % of one core, attached to a running `bsmon demo`.

Each size runs `bsmon demo` in a private tmux server (a real terminal of that size), waits
for LIVE and a few seconds more, then reads the dashboard process's CPU time (utime + stime
from /proc/PID/stat) over ``--seconds``. The demo job is another process and is not counted;
nor is tmux.

    python benchmarks/dashboard_cpu.py [--seconds 20] [--sizes 80x24,120x40] [--interval S]
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (fields 14 and 15 of /proc/PID/stat)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()  # after the command name, field 3 on
    return (int(fields[11]) + int(fields[12])) / TICKS


class Pane:
    def __init__(self, width: int, height: int) -> None:
        self.server = f"bsmon-cpu-{uuid.uuid4().hex[:8]}"
        self.width, self.height = width, height

    def tmux(self, *args: str) -> str:
        out = subprocess.run(
            ["tmux", "-L", self.server, *args], check=False, capture_output=True, text=True
        )
        return out.stdout

    def start(self, command: str) -> None:
        size = ["-x", str(self.width), "-y", str(self.height)]
        shell = f"env -u COLUMNS -u LINES {command}; sleep 600"
        self.tmux("-f", "/dev/null", "new-session", "-d", "-s", "main", *size, shell)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-t", "main", "-p")

    def kill(self) -> None:
        self.tmux("kill-server")


def measure(width: int, height: int, seconds: float, extra: list[str], directory: Path) -> float:
    """% of a core the dashboard used over ``seconds`` at ``width``×``height``."""
    pid_file = directory / f"dashboard-{width}x{height}.pid"
    cli = [sys.executable, "-m", "bsmon.tui.cli", "demo", *extra]
    inner = f"echo $$ > {pid_file}; exec {shlex.join(cli)}"
    pane = Pane(width, height)
    pane.start(f"BSMON_DIR={directory} sh -c {shlex.quote(inner)}")
    try:
        deadline = time.monotonic() + 90
        while "LIVE" not in pane.screen():
            if time.monotonic() > deadline:
                raise SystemExit(f"no LIVE dashboard after 90 s:\n{pane.screen()}")
            time.sleep(0.5)
        time.sleep(5)  # the backlog drawn, the demo up to speed
        pid = int(pid_file.read_text())
        cpu0, wall0 = cpu_seconds(pid), time.monotonic()
        time.sleep(seconds)
        cpu1, wall1 = cpu_seconds(pid), time.monotonic()
        pane.tmux("send-keys", "-t", "main", "q")
        time.sleep(3)
    finally:
        pane.kill()
    return 100 * (cpu1 - cpu0) / (wall1 - wall0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--sizes", default="80x24,120x40")
    parser.add_argument("--interval", type=float, default=None, help="bsmon's --interval")
    args = parser.parse_args()
    if shutil.which("tmux") is None:
        print("tmux is not installed", file=sys.stderr)
        return 1
    extra = ["--interval", str(args.interval)] if args.interval is not None else []
    label = f"--interval {args.interval}" if extra else "the default interval"
    with tempfile.TemporaryDirectory(prefix="bsmon-cpu-") as tmp:
        os.chmod(tmp, 0o700)
        for size in args.sizes.split(","):
            width, height = (int(v) for v in size.split("x"))
            percent = measure(width, height, args.seconds, extra, Path(tmp))
            print(f"{width}x{height}: {percent:5.1f}% of a core ({label}, {args.seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
