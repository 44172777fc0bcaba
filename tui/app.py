"""The bsmon Textual app: finds the job (or lets you pick one) and shows its dashboard."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.notifications import Notify
from textual.screen import Screen

from bsmon.probes.wire import discovery

from .disabled import APP_ACTIONS, app_why_off
from .help import HelpScreen, quit_help
from .job_screens import NoJobsScreen, PickerScreen
from .palette import dashboard_commands
from .screens import DashboardScreen
from .settings import DETACH, settings
from .sources import SocketSource, Source

DISCOVERY_INTERVAL_S = 1.0
MAX_TOASTS = 2  # more would stack over the charts; the Events panel keeps everything


def follow_job(socket: Path, name: str | None, directory: Path | None) -> SocketSource:
    """A source for the job at ``socket`` that finds it again by name if it restarts."""

    def resolve() -> Path:
        if socket.exists():
            return socket
        if name:
            return discovery.resolve_target(name, directory)
        raise LookupError(f"{socket} is gone")

    return SocketSource(name or str(socket), resolve)


class BsmonApp(App[str | None]):
    CSS_PATH = "bsmon.tcss"
    TITLE = "bsmon"
    BINDINGS = [
        Binding("q", "quit", "Quit", id="quit", priority=False),
        # Ctrl-C quits, as in every monitor people use (Textual would only say ctrl+q)
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
        Binding("d", "detach", "Detach", id="detach"),
        Binding("j", "jobs", "Jobs", id="jobs"),
    ]

    def __init__(
        self,
        source: Source | None = None,
        *,
        directory: Path | None = None,
        readonly: bool = False,
        dashboard: type[DashboardScreen] = DashboardScreen,
    ) -> None:
        super().__init__()
        self.source = source
        self.directory = directory or discovery.default_dir()
        self.readonly = readonly
        self.dashboard = dashboard  # the screen class for a source (replay: ReplayScreen)
        self.export_dir: Path | None = None  # where `e` writes (None: beside the record)
        self.picked = False  # the job on screen was chosen in the picker: `j` goes back to it

    def on_mount(self) -> None:
        if self.source is not None:
            self.push_screen(self.dashboard(self.source, self.readonly))
        else:
            self.discover()

    def discover(self) -> None:
        try:
            jobs = list(discovery.iter_jobs(self.directory))
        except discovery.BsmonDirError as exc:
            self.exit(message=str(exc), return_code=2)
            return
        self.picked = len(jobs) > 1  # j goes back to the picker only while it has a choice
        if len(jobs) == 1:
            self.open_job(jobs[0])
        elif jobs:
            self.push_screen(PickerScreen(jobs, time.time()), self._picked)
        else:
            self.push_screen(NoJobsScreen(self.directory))
            self.set_timer(DISCOVERY_INTERVAL_S, self._poll_for_jobs)

    def _poll_for_jobs(self) -> None:
        if not isinstance(self.screen, NoJobsScreen):
            return
        try:
            found = any(True for _ in discovery.iter_jobs(self.directory))
        except discovery.BsmonDirError:
            found = False
        if found:
            self.pop_screen()
            self.discover()
        else:
            self.set_timer(DISCOVERY_INTERVAL_S, self._poll_for_jobs)

    def _picked(self, socket: Path | None) -> None:
        if socket is None:
            return
        entry = next((j for j in discovery.iter_jobs(self.directory) if j.socket == socket), None)
        if entry is None:
            self.notify(f"{socket} has gone away", severity="error")
            self.discover()
            return
        self.open_job(entry)

    def open_job(self, job: discovery.JobEntry) -> None:
        self.source = follow_job(job.socket, job.name, self.directory)
        self.push_screen(DashboardScreen(self.source, self.readonly))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        for command in super().get_system_commands(screen):
            if command.title == "Quit":  # what quitting does to the job depends on the mode
                yield command._replace(help=quit_help(settings.mode))
            else:
                yield command
        if isinstance(screen, DashboardScreen):
            yield from dashboard_commands(screen)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in APP_ACTIONS:  # hidden when off; the dashboard says why when pressed
            return app_why_off(action, settings.mode, self.picked) is None
        return super().check_action(action, parameters)

    def action_jobs(self) -> None:
        """Back to the picker: close the job's screens and look for jobs again."""
        while len(self.screen_stack) > 1:
            self.pop_screen()
        self.discover()

    def action_detach(self) -> None:
        """Close the dashboard and leave the job running (`bsmon run` says how to return)."""
        self.exit(result=DETACH)

    def _on_notify(self, event: Notify) -> None:
        """Keep at most MAX_TOASTS on screen: a new one replaces the oldest."""
        for old in list(self._notifications)[: max(0, len(self._notifications) - MAX_TOASTS + 1)]:
            self._unnotify(old, refresh=False)
        super()._on_notify(event)

    def on_unmount(self) -> None:
        if self.source is not None:
            self.source.stop()
