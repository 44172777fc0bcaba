"""Drive a real terminal: a private tmux server, send-keys in, capture-pane out."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest


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
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = self.screen()
            if predicate(text):
                return text
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}; the screen was:\n{text}")

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.server, "kill-server"], capture_output=True, timeout=30)
