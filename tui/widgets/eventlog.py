"""The job's events, newest last, stamped with the time into the run and the step."""

from __future__ import annotations

from rich.markup import escape
from rich.text import Text
from textual import events
from textual.widgets import RichLog

from bsmon.probes.wire.protocol import Event

from .. import format as fmt
from ..session import Snapshot

LEVEL_MARKS = {"info": ("•", "accent"), "warning": ("▲", "warning"), "error": ("✖", "error")}


class EventLog(RichLog):
    DEFAULT_CSS = "EventLog { height: 1fr; overflow-y: auto; scrollbar-size-vertical: 1; }"

    def __init__(self, **kwargs: object) -> None:
        super().__init__(wrap=True, min_width=16, max_lines=1000, **kwargs)  # type: ignore[arg-type]
        self._last: Event | None = None
        self._snap: Snapshot | None = None
        self._width = 0

    def show(self, snap: Snapshot) -> None:
        self._snap = snap
        events = snap.events
        new = self._unseen(events)
        if new is None:  # the history was replaced (a new job): redraw it all
            self.clear()
            new = events
        start = snap.session.start_time if snap.session else None
        for event in new:
            self.write(self.event_text(event, start))
        if events:
            self._last = events[-1]

    def on_resize(self, event: events.Resize) -> None:
        """Lines are wrapped when written: at a new width, wrap them all again (a line
        wrapped for a wider panel would be cut at the new edge)."""
        if event.size.width != self._width:
            self._width = event.size.width
            self.call_after_refresh(self._rewrap)  # once the new width is laid out

    def _rewrap(self) -> None:
        if self._snap is not None:
            self._last = None
            self.clear()
            self.show(self._snap)

    def _unseen(self, events: tuple[Event, ...]) -> tuple[Event, ...] | None:
        if self._last is None:
            return events
        for index in range(len(events) - 1, -1, -1):
            if events[index] is self._last:
                return events[index + 1 :]
        return None

    def event_text(self, event: Event, start_time: float | None) -> Text:
        colors = self.app.theme_variables
        offset = fmt.clock(event.t - start_time) if start_time is not None else "?"
        mark, color = LEVEL_MARKS.get(event.level, LEVEL_MARKS["info"])
        muted = colors.get("text-muted", "grey50")
        return Text.from_markup(
            f"[{muted}]{offset} step {event.step}[/] [{colors.get(color, 'default')}]{mark}[/] "
            f"{escape(event.message)}"
        )
