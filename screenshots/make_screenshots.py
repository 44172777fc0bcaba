"""Make the README's screenshots from real sessions: the demo job trains in a subprocess
(its CNN, then its sequence model, ``--model lm``, for the tokens line), and the dashboard,
attached to it over its socket, saves SVGs (and PNGs when rsvg-convert or cairosvg is
available).

    python screenshots/make_screenshots.py [--warmup 25]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import html
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

    from textual.pilot import Pilot

HERE = Path(__file__).resolve().parent
JOBS = {  # the demo job's arguments: its shots (name, terminal size, keys pressed first)
    ("--name", "demo"): [
        ("dashboard-120x40", (120, 40), ()),
        ("dashboard-80x24", (80, 24), ()),
        ("time-80x24", (80, 24), ("t",)),
    ],
    ("--name", "tiny-gpt", "--model", "lm"): [("sequence-120x40", (120, 40), ())],
}


# One run of text in Rich's SVG: every cell of it is ``textLength`` / len(text) wide.
TEXT_RUN = re.compile(
    r'<text class="(?P<cls>[^"]*)" x="(?P<x>[\d.]+)" y="(?P<y>[\d.]+)" '
    r'textLength="(?P<length>[\d.]+)" clip-path="url\(#(?P<clip>[^)]*)\)">(?P<text>[^<]*)</text>'
)


def has_braille(text: str) -> bool:
    return any("\u2800" <= c <= "\u28ff" for c in text)


def braille_in_cells(svg_text: str) -> str:
    """The SVG with each braille character (the charts) placed in its own cell.

    Rich gives a run of text its width with ``textLength``, which librsvg ignores; no
    installed monospace font has braille, so the fallback's wider glyphs would push a chart's
    lines past its frame in the PNG. Placing every glyph at its cell keeps the picture true to
    the terminal."""

    def place(run: re.Match) -> str:
        text = html.unescape(run["text"])
        if not has_braille(text):
            return run[0]
        cell = float(run["length"]) / len(text)
        x = float(run["x"])
        return "".join(
            f'<text class="{run["cls"]}" x="{x + i * cell:.1f}" y="{run["y"]}" '
            f'textLength="{cell:.1f}" clip-path="url(#{run["clip"]})">{html.escape(c)}</text>'
            for i, c in enumerate(text)
            if c != " "
        )

    return TEXT_RUN.sub(place, svg_text)


def to_png(svg: Path) -> Path | None:
    png = svg.with_suffix(".png")
    svg_text = braille_in_cells(svg.read_text(encoding="utf-8"))
    if shutil.which("rsvg-convert"):
        with tempfile.NamedTemporaryFile("w", suffix=".svg", encoding="utf-8") as fixed:
            fixed.write(svg_text)
            fixed.flush()
            subprocess.run(["rsvg-convert", "-o", str(png), fixed.name], check=True)
        return png
    try:
        import cairosvg
    except ImportError:
        return None
    cairosvg.svg2png(bytestring=svg_text.encode(), write_to=str(png))
    return png


async def settled(pilot: Pilot, checks: int = 4) -> None:
    """Wait until the panels' heights have held for ``checks`` looks a quarter second apart (the
    first frames fit the Noise panel to panels that have no data yet; on a busy machine the
    layout takes a while to settle), at most 15 s."""
    seen: list[tuple[int, ...]] = []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        await pilot.pause(0.25)
        panels = pilot.app.screen.query(".panel")
        seen.append(tuple(panel.region.height for panel in panels))
        if len(seen) >= checks and len(set(seen[-checks:])) == 1:
            return


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
        await settled(pilot)
        path = app.save_screenshot(filename=f"{name}.svg", path=str(HERE))
    return Path(path)


@contextlib.contextmanager
def demo_job(directory: Path, arguments: tuple[str, ...]) -> Iterator[Path]:
    """The demo job started with ``arguments``: its socket, once it serves; stopped after."""
    command = [sys.executable, "-m", "bsmon.probes.demo", *arguments, "--report-every", "0"]
    job = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        socket = directory / f"{job.pid}.sock"
        deadline = time.monotonic() + 60
        while not socket.exists():
            if job.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the demo job ({' '.join(arguments)}) did not start")
            time.sleep(0.2)
        yield socket
    finally:
        job.terminate()
        job.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=float, default=25.0, help="seconds of training first")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="bsm-shots-", dir="/tmp"))
    os.environ["BSMON_DIR"] = str(directory)
    try:
        for arguments, shots in JOBS.items():
            with demo_job(directory, arguments) as socket:
                time.sleep(args.warmup)
                for name, size, keys in shots:
                    svg = asyncio.run(capture(socket, size, name, keys))
                    png = to_png(svg)
                    made = f" and {png.name}" if png else ""
                    print(f"wrote {svg.relative_to(HERE.parent)}{made}")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
