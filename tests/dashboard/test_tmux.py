"""`bsmon demo` in a real terminal: the screen updates, q and Ctrl-C quit and say where the
record is, nothing is left running; the advice and the probe's recommendation are in view at
80×24 and 120×40."""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from bsmon.probes.wire import protocol
from bsmon.probes.wire.client import JobConnection

from ..helpers import ROOT, wait_until
from ..tmux import Tmux
from ..watch import job_socket


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
            with contextlib.suppress(psutil.Error):
                left = proc.children(recursive=True)  # a probe's sidecar, in its own session
                proc.kill()
                for child in left:
                    child.kill()


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


def panel_rows(screen: str, title: str) -> list[str] | None:
    """The text rows inside the box titled ``title`` (None: no such box on the screen)."""
    rows = screen.splitlines()
    top = next((i for i, row in enumerate(rows) if f"╭─ {title} " in row), None)
    if top is None:
        return None
    left = rows[top].index(f"╭─ {title} ")
    right = rows[top].index("╮", left)
    inside = []
    for row in rows[top + 1 :]:
        if row[left : left + 1] != "│":
            break
        inside.append(row[left + 1 : right].strip())
    return inside


def joined(rows: list[str]) -> str:
    """Rows as one text, as a reader reads a wrapped line on (Textual wraps at spaces)."""
    return " ".join(" ".join(rows).split())


class AgentSays:
    """What the demo job itself says, read from its socket beside the dashboard: every
    advice its metrics carried (headline, why) and the finished probe's recommendation."""

    def __init__(self, conn: JobConnection) -> None:
        self.conn = conn
        self.advice: set[tuple[str, str]] = set()
        self.recommendation: protocol.Recommendation | None = None

    def read(self) -> None:
        while messages := self.conn.pump(0):
            for message in messages:
                if isinstance(message, protocol.Hello | protocol.Metrics) and message.advice:
                    self.advice.add((message.advice.headline, message.advice.why))
                if isinstance(message, protocol.Metrics) and message.probe.result is not None:
                    self.recommendation = message.probe.result.recommendation

    def advice_on(self, rows: list[str]) -> tuple[str, str] | None:
        """The advice (one the job gave) that ``rows`` show whole, if any."""
        self.read()
        text = joined(rows)
        return next(
            ((h, why) for h, why in self.advice if f"advice {joined([h, why])}" in text), None
        )


def batch_rows(screen: str) -> list[str]:
    rows = panel_rows(screen, "Batch")
    assert rows is not None, screen
    return rows


def advice_in_view(tmux: Tmux, agent: AgentSays) -> tuple[str, str]:
    """The screen once its Batch panel shows an advice the job gave, and that advice's
    headline. The advice comes with the speed, in the same message: once the panel shows a
    speed, the wait is a redraw or two (and the job's newest advice reaching both clients)."""
    tmux.wait_for(
        lambda s: any(r.startswith("speed") for r in panel_rows(s, "Batch") or []),
        what="the Batch panel with a speed",
    )
    shown = [""]

    def advice_shown() -> tuple[str, str] | None:
        shown[0] = tmux.screen()
        return agent.advice_on(batch_rows(shown[0]))

    advice = wait_until(
        advice_shown,
        timeout=60,
        interval=0.2,
        message=lambda: f"an advice the job gave ({agent.advice}) on:\n{shown[0]}",
    )
    return shown[0], advice[0]  # type: ignore[index]


def probe_in_view(tmux: Tmux, agent: AgentSays) -> str:
    """`p`, yes, and the probe screen once the probe has finished (or failed)."""
    tmux.send("p")
    tmux.wait_for(lambda s: "Probe the largest batch size?" in s, what="the probe's question")
    tmux.send("y")

    def finished(screen: str) -> bool:
        agent.read()
        return "✖ probe" in screen or ("✔ done" in screen and bool(agent.recommendation))

    return tmux.wait_for(finished, what="the finished probe's result")


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_advice_and_the_probes_recommendation_are_in_view_without_scrolling(bsmon_dir, size):
    """The Batch panel's advice (its headline and short reason, as the job gave them), then
    the finished probe's recommendation and its first reason: on the visible rows of a real
    terminal of ``size`` (capture-pane has no scrollback)."""
    with demo_in_tmux(bsmon_dir, size) as tmux:
        tmux.wait_for(lambda s: "LIVE" in s, what="the live dashboard")
        with JobConnection(job_socket("demo", bsmon_dir)) as conn:
            agent = AgentSays(conn)
            screen, headline = advice_in_view(tmux, agent)
            # the headline on the advice row, its short reason on the row below
            rows = batch_rows(screen)
            at = next(i for i, r in enumerate(rows) if r.startswith("advice"))
            assert rows[at].rstrip() == f"advice  {headline}", screen
            screen = probe_in_view(tmux, agent)
        assert "✔ done" in screen, screen
        rows = screen.splitlines()
        top = rows[: next(i for i, r in enumerate(rows) if "╭─ Probe: largest batch" in r)]
        said = agent.recommendation
        assert said is not None and said.reasons
        line = next((r.strip() for r in top if r.strip().startswith("recommended")), "")
        assert f"{said.batch_size:,}" in line, screen  # "recommended batch: 128 — press a…"
        assert f"· {joined([said.reasons[0]])}" in joined(top), screen  # wraps at 80
