"""Make the README's screenshots from a real session: the demo job trains in a subprocess,
and the dashboard, attached to it over its socket, saves SVGs (and PNGs when rsvg-convert
or cairosvg is available).

    python screenshots/make_screenshots.py [--warmup 25]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHOTS = [  # (name, terminal size, keys pressed first)
    ("dashboard-120x40", (120, 40), ()),
    ("dashboard-80x24", (80, 24), ()),
    ("time-80x24", (80, 24), ("t",)),
]


def to_png(svg: Path) -> Path | None:
    png = svg.with_suffix(".png")
    if shutil.which("rsvg-convert"):
        subprocess.run(["rsvg-convert", "-o", str(png), str(svg)], check=True)
        return png
    try:
        import cairosvg
    except ImportError:
        return None
    cairosvg.svg2png(url=str(svg), write_to=str(png))
    return png


async def capture(socket: Path, size: tuple[int, int], name: str, keys: tuple[str, ...]) -> Path:
    from bsmon.tui.app import BsmonApp, follow_job
    from bsmon.tui.screens import DashboardScreen

    app = BsmonApp(follow_job(socket, None, None))
    async with app.run_test(size=size) as pilot:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            screen = app.screen
            if isinstance(screen, DashboardScreen) and screen.snapshot and screen.snapshot.points:
                break
            await pilot.pause(0.1)
        else:
            raise SystemExit("the dashboard got no data from the demo job within 30 s")
        for key in keys:
            await pilot.press(key)
        await pilot.pause(1.0)
        path = app.save_screenshot(filename=f"{name}.svg", path=str(HERE))
    return Path(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=float, default=25.0, help="seconds of training first")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="bsm-shots-", dir="/tmp"))
    os.environ["BSMON_DIR"] = str(directory)
    job = subprocess.Popen(
        [sys.executable, "-m", "bsmon.probes.demo", "--name", "demo", "--report-every", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        socket = directory / f"{job.pid}.sock"
        deadline = time.monotonic() + 60
        while not socket.exists():
            if job.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the demo job did not start")
            time.sleep(0.2)
        time.sleep(args.warmup)
        for name, size, keys in SHOTS:
            svg = asyncio.run(capture(socket, size, name, keys))
            png = to_png(svg)
            print(f"wrote {svg.relative_to(HERE.parent)}" + (f" and {png.name}" if png else ""))
    finally:
        job.terminate()
        job.wait(30)
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
