"""Drive a real terminal: a private tmux server, send-keys in, capture-pane out."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from .helpers import wait_until


class Tmux:
    def __init__(self, width: int = 100, height: int = 30) -> None:
        if shutil.which("tmux") is None:
            pytest.skip("tmux is not installed")
        self.server = f"bsmon-test-{uuid.uuid4().hex[:8]}"
        self.width, self.height = width, height

    def run(self, *args: str) -> str:
        result = subprocess.run(
            ["tmux", "-L", self.server, *args], capture_output=True, text=True, timeout=30
        )
        if result.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def start(self, command: str, cwd: Path, env: dict[str, str]) -> None:
        exports = " ".join(f"{k}={v}" for k, v in env.items())
        self.run(
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            "main",
            "-x",
            str(self.width),
            "-y",
            str(self.height),
            "-c",
            str(cwd),
            # COLUMNS and LINES from the test process (pytest plugins set them) would
            # override the pane's own size in the program
            f"env -u COLUMNS -u LINES {exports} {command}; echo BSMON-EXITED-$?; sleep 600",
        )
        self.run("set", "-sg", "escape-time", "0")

    def screen(self) -> str:
        return self.run("capture-pane", "-t", "main", "-p")

    def send(self, *keys: str) -> None:
        self.run("send-keys", "-t", "main", *keys)

    def wait_for(self, predicate, timeout: float = 60.0, what: str = "screen") -> str:
        """The screen once ``predicate`` holds; ``timeout`` is how long it may stay unchanged
        (a dashboard busy on a loaded machine still redraws)."""
        shown = [""]

        def wanted() -> str | None:
            shown[0] = self.screen()
            return shown[0] if predicate(shown[0]) else None

        return wait_until(  # type: ignore[return-value]
            wanted,
            timeout=timeout,
            interval=0.2,
            message=lambda: f"{what}; the screen was:\n{shown[0]}",
            progress=lambda: shown[0],
        )

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.server, "kill-server"], capture_output=True, timeout=30)
