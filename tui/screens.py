"""The dashboard screen (the picker and the no-job screen are in ``job_screens``)."""

from __future__ import annotations

from pathlib import Path

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer

from bsmon.probes.wire import describe_advice
from bsmon.probes.wire.protocol import (
    AutopilotCommand,
    ProbeCommand,
    ProbeReading,
    Reply,
    SetBatchSize,
    StepBatchSize,
)

from .anatomy_screen import AnatomyScreen
from .commands import CommandDesk
from .confirm import ConfirmScreen
from .disabled import (
    ACTIONS,
    APP_ACTIONS,
    KEY_ACTIONS,
    NOT_DISTRIBUTED,
    app_why_off,
    key_of,
    keys_off,
    why_off,
)
from .help import HelpScreen
from .messages import SnapshotArrived
from .probe_screen import ProbeScreen
from .ranks_screen import RanksScreen
from .session import Snapshot
from .settings import interval_text, next_interval, settings
from .sources import Source, Update
from .widgets import Panel
from .widgets.banner import StateBanner
from .widgets.batch import BatchPanel
from .widgets.charts import ScalarChart, ThroughputChart
from .widgets.devices import DevicePanel
from .widgets.eventlog import EventLog
from .widgets.header import JobHeader
from .widgets.noise import NoisePanel

PROBE_QUESTION = (
    "A separate process will load a copy of the model's structure (not its weights) and train "
    "it for a few steps at up to three larger batch sizes on the same device, to measure peak "
    "memory and throughput. The job keeps training, but slows while the probe shares the "
    "device; an out-of-memory error in the probe never reaches the job, and a watchdog stops "
    "the probe if the device runs low. It takes from seconds to a few minutes."
)

LAST_RESULT_KEY = "l"
LAST_RESULT_HINT = "A probe has finished: l shows its result again, without probing."

PANEL_TITLES = {
    "devices": "Devices",
    "batch": "Batch",
    "noise": "Noise scale",
    "throughput": "Step time · throughput",
    "scalars": "Loss",
    "events": "Events",
}


BATCH_KEYS = Binding.Group("Batch", compact=True)  # the footer shows "+ - Batch"


class DashboardScreen(Screen):
    """One job, live: header, device/batch/noise panels, charts, events."""

    BINDINGS = [
        Binding("question_mark", "help", "Help", id="help"),
        Binding("plus,equals_sign", "batch('up')", "Batch +", id="batch_up", group=BATCH_KEYS),
        Binding("minus", "batch('down')", "Batch −", id="batch_down", group=BATCH_KEYS),
        Binding("p", "probe", "Probe", id="probe"),
        Binding("a", "autopilot", "Auto", id="autopilot"),
        Binding("t", "anatomy", "Time", id="anatomy"),
        Binding("r", "ranks", "Ranks", id="ranks"),
        Binding("e", "export", "Export", id="export"),
        Binding("l", "events", "Events", id="events"),
        Binding("right_square_bracket", "interval(1)", "Slower", id="interval_up", show=False),
        Binding("left_square_bracket", "interval(-1)", "Faster", id="interval_down", show=False),
    ]
    # actions that act on the job: removed by --readonly, disabled when the job cannot do them
    JOB_ACTIONS = {"batch": "step_batch_size", "probe": "probe", "autopilot": "autopilot"}

    def __init__(
        self, source: Source, readonly: bool = False, interval: float | None = None
    ) -> None:
        super().__init__()
        self.source = source
        self.snapshot: Snapshot | None = None
        self.commands = CommandDesk(source, readonly)
        self.interval = interval or settings.interval_s
        self._waiting: Snapshot | None = None  # the newest snapshot, drawn at the next tick
        self._keys_state: tuple[str | None, ...] = ()

    def compose(self) -> ComposeResult:
        yield JobHeader()
        yield StateBanner()
        with Horizontal(id="body"):
            with Vertical(id="left"):
                yield DevicePanel(id="devices", classes="panel")
                yield BatchPanel(id="batch", classes="panel")
                yield NoisePanel(id="noise", classes="panel")
            with Vertical(id="right"):
                yield ThroughputChart(id="throughput", classes="panel")
                yield ScalarChart(id="scalars", classes="panel")
                yield EventLog(id="events", classes="panel")
        yield Footer()

    def on_mount(self) -> None:
        for panel_id, title in PANEL_TITLES.items():
            self.query_one(f"#{panel_id}").border_title = title
        self._ticker = self.set_interval(self.interval, self._tick)
        self.run_worker(self._pump_source, thread=True, name="source", exit_on_error=False)

    def on_unmount(self) -> None:
        self.source.stop()

    def on_resize(self, event: events.Resize) -> None:
        self.set_class(event.size.width >= 140, "wide")
        self.set_class(event.size.height < 30, "compact")
        footer = self.query_one(Footer)  # every key fits at 80 columns, q Quit included:
        footer.compact = event.size.width < 100
        footer.show_command_palette = event.size.width >= 100  # ctrl+p works all the same

    def action_events(self) -> None:
        """The Events panel over the whole screen, or back (``l`` again, or ``esc``)."""
        log = self.query_one(EventLog)
        if self.maximized is log:
            self.minimize()
        else:
            self.maximize(log, container=False)
            log.scroll_end(animate=False)

    def action_interval(self, direction: int) -> None:
        """Redraw less (``]``) or more (``[``) often."""
        self.set_refresh_interval(next_interval(self.interval, direction))

    def set_refresh_interval(self, seconds: float) -> None:
        self.interval = settings.interval_s = seconds
        self._ticker.stop()
        self._ticker = self.set_interval(seconds, self._tick)
        self.notify(f"the dashboard redraws every {interval_text(seconds)}", timeout=3)

    def _pump_source(self) -> None:
        self.source.run(lambda update: self.post_message(SnapshotArrived(update)))

    @on(SnapshotArrived)
    def _show(self, message: SnapshotArrived) -> None:
        """Replies and notices at once; the panels at the refresh interval, or at once for
        the first frame, a change of state, a reply (a key's result) and a replay."""
        update = message.update
        snap, last = update.snapshot, self.snapshot
        now = last is None or snap.replay is not None or _state(snap) != _state(last)
        if now or update.replies:
            self.show_snapshot(snap)
        else:
            self._waiting = snap
        self._tell(update)

    def _tick(self) -> None:
        if self._waiting is not None:
            self.show_snapshot(self._waiting)

    def show(self, update: Update) -> None:
        """Show an update at once (its snapshot, replies and notices)."""
        self.show_snapshot(update.snapshot)
        self._tell(update)

    def _tell(self, update: Update) -> None:
        for reply in update.replies:
            self._answer(reply)
        for notice in update.notices:
            self.notify(notice.message, severity="warning", timeout=6)

    def show_snapshot(self, snap: Snapshot) -> None:
        self._waiting = None
        self.snapshot = snap
        self.query_one(JobHeader).show(snap)
        self.query_one(StateBanner).show(snap)
        for panel in self.query(".panel"):
            if isinstance(panel, Panel):  # every one is (tests/dashboard/test_tui_layout.py)
                panel.show(snap)
        self.query_one("#scalars").border_title = ScalarChart.title(snap)
        screen = self.app.screen
        if isinstance(screen, (ProbeScreen, RanksScreen, AnatomyScreen)) and screen.is_mounted:
            screen.show(snap)
        keys_state = tuple(why_off(snap, action) for action in ACTIONS)
        if keys_state != self._keys_state:  # the footer is rebuilt only when a key changes
            self._keys_state = keys_state
            self.refresh_bindings()

    def action_help(self) -> None:
        off = keys_off(self.snapshot) if self.snapshot is not None else {}
        self.app.push_screen(
            HelpScreen(off, replay=self.snapshot is not None and self.snapshot.replay is not None)
        )

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in APP_ACTIONS:  # the app's keys (d, j): its check_action, its reason
            return self.app.check_action(action, parameters)
        if action in self.JOB_ACTIONS and self.commands.readonly:
            return False  # hidden: the monitor was started with --readonly
        why = why_off(self.snapshot, action)
        if why == NOT_DISTRIBUTED:
            return False  # hidden: a single process never has ranks (r still says why)
        return None if why else True  # None: greyed

    def on_key(self, event: events.Key) -> None:
        """A greyed or hidden key says why it does nothing (its binding did not run)."""
        action = KEY_ACTIONS.get(event.key)
        if action is None or self.check_action(action, ()) is True:
            return
        self.explain(action)
        event.stop()

    def explain(self, action: str) -> None:
        """Toast why ``action`` cannot act now."""
        if action in self.JOB_ACTIONS and self.commands.readonly:
            why = self.source.readonly_reason or "the monitor is read-only (bsmon --readonly)"
        elif action in APP_ACTIONS:
            why = app_why_off(action, settings.mode, getattr(self.app, "picked", False))
        else:
            why = why_off(self.snapshot, action)
        why = why or "not available now"
        self.notify(f"{key_of(action)} is off: {why}", severity="warning", timeout=5)

    def run_or_explain(self, action: str, *args: object) -> None:
        """Run ``action`` (the palette's way in), or say why it cannot act now."""
        if self.check_action(action, args) is True:
            getattr(self, f"action_{action}")(*args)
        else:
            self.explain(action)

    def action_detach(self) -> None:  # the palette's way to the app's `d`
        self.app.action_detach()  # type: ignore[attr-defined]

    def action_jobs(self) -> None:  # the palette's way to the app's `j`
        self.app.action_jobs()  # type: ignore[attr-defined]

    def action_batch(self, direction: str) -> None:
        self.commands.send(StepBatchSize(direction=direction))  # type: ignore[arg-type]

    def action_autopilot(self) -> None:
        """On when it is not steering (off, paused by a key, refused earlier), else off."""
        latest = self.snapshot.latest if self.snapshot is not None else None
        steering = latest is not None and latest.autopilot is not None
        steering = steering and latest.autopilot.state == "on"  # type: ignore[union-attr]
        self.commands.send(AutopilotCommand(on=not steering))

    def action_probe(self) -> None:
        """Ask before a new probe; once one has finished, the question can show its result."""
        reading = self._probe_reading()
        if reading is not None and reading.status == "running":
            self.open_probe_screen()
            return

        def answered(answer: bool | str | None) -> None:
            if answer == LAST_RESULT_KEY:
                self.open_probe_screen()
            elif answer is True:
                self.commands.send(ProbeCommand())
                self.open_probe_screen()

        finished = reading is not None and reading.result is not None
        question = f"{PROBE_QUESTION}\n\n{LAST_RESULT_HINT}" if finished else PROBE_QUESTION
        other = (LAST_RESULT_KEY, "Last result") if finished else None
        self.app.push_screen(
            ConfirmScreen("Probe the largest batch size?", question, other), answered
        )

    def action_probe_result(self) -> None:
        """The probe screen with the last result (the palette's way in: works read-only too)."""
        reading = self._probe_reading()
        if reading is None or (reading.result is None and reading.status != "running"):
            self.notify("no probe has run yet", severity="warning", timeout=4)
        else:
            self.open_probe_screen()

    def _probe_reading(self) -> ProbeReading | None:
        snap = self.snapshot
        return snap.latest.probe if snap is not None and snap.latest is not None else None

    def open_probe_screen(self) -> None:
        can_apply = self.check_action("batch", ()) is True
        self.app.push_screen(ProbeScreen(self.apply_batch_size, can_apply, self.snapshot))

    def action_ranks(self) -> None:
        self.app.push_screen(RanksScreen(self.snapshot))

    def action_anatomy(self) -> None:
        self.app.push_screen(AnatomyScreen(self.snapshot))

    def apply_batch_size(self, size: int) -> None:
        self.commands.send(SetBatchSize(value=size, reason="the probe's recommendation"))

    def _answer(self, reply: Reply) -> None:
        outcome = self.commands.answer(reply)
        if outcome is None:
            return
        if outcome.kind == "done":
            self.notify(outcome.message, timeout=4)
        elif outcome.kind == "refused":
            self.notify(outcome.message, severity="error", timeout=6)
        else:
            retry = outcome.retry

            def confirmed(yes: bool | None) -> None:
                if yes and retry is not None:
                    self.commands.send(retry)

            question = f"{outcome.message}.\n\n"
            latest = self.snapshot.latest
            if latest is not None and latest.advice is not None:  # the agent's one answer
                question += f"The {describe_advice(latest.advice)}.\n\n"
            question += "Apply it anyway?"
            self.app.push_screen(ConfirmScreen("Risky batch size", question), confirmed)

    def action_export(self) -> None:
        """Save the screenshot now and write the summary on a worker thread."""
        from .export import export_base, export_directory, export_session

        app = self.app
        snap = self.snapshot
        if snap is None or snap.session is None:
            app.notify("nothing to export yet: no job on screen", severity="warning")
            return
        base = getattr(app, "export_dir", None) or export_base(snap.session)
        directory = export_directory(Path(base), snap.session.name)
        try:
            directory.mkdir(parents=True)
            app.save_screenshot(filename="screen.svg", path=str(directory))
        except OSError as exc:
            app.notify(f"cannot export to {directory}: {exc.strerror or exc}", severity="error")
            return

        def work() -> None:
            try:
                summary = export_session(snap, directory)
            except Exception as exc:  # shown, never raised into the app
                message = f"export failed: {exc}; the screenshot is in {directory}"
                app.call_from_thread(app.notify, message, severity="error", timeout=10)
                return
            how = (
                "from the record"
                if summary.source.kind == "record"
                else "from the dashboard's data"
            )
            message = f"exported {how} to {directory}/: summary.md, summary.json, screen.svg"
            app.call_from_thread(app.notify, message, title="Export", timeout=12)

        self.run_worker(work, thread=True, name="export", exit_on_error=False)


def _state(snap: Snapshot) -> tuple[object, bool]:
    """What the header's state says: a change is drawn at once."""
    return snap.state, snap.silent_s is not None
