"""A yes/no question before an action that could hurt the job (and, where asked, a third
answer that does something harmless instead)."""

from __future__ import annotations

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.markup import escape
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmScreen(ModalScreen[bool | str]):
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical {
        width: 64; height: auto; border: round $warning; background: $surface; padding: 1 2;
    }
    ConfirmScreen #question { margin-bottom: 1; }
    ConfirmScreen Horizontal { height: auto; align: right middle; }
    ConfirmScreen Button { margin-left: 2; }
    """
    BINDINGS = [
        Binding("y", "answer(True)", "Yes", id="confirm_yes"),
        Binding("n,escape", "answer(False)", "No", id="confirm_no"),
    ]

    def __init__(self, title: str, question: str, other: tuple[str, str] | None = None) -> None:
        """``other``: a third answer, as (its key, its button's label); it answers its key."""
        super().__init__()
        self.title_text = title
        self.question = question
        self.other = other

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(f"[b]{escape(self.title_text)}[/b]")
            yield Static(escape(self.question), id="question")
            with Horizontal():
                yield Button("No (n)", id="no")
                if self.other is not None:
                    key, label = self.other
                    yield Button(f"{label} ({key})", id="other")
                yield Button("Yes (y)", id="yes", variant="warning")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "other" and self.other is not None:
            self.dismiss(self.other[0])
        else:
            self.dismiss(event.button.id == "yes")

    def on_key(self, event: events.Key) -> None:
        if self.other is not None and event.key == self.other[0]:
            event.stop()
            self.dismiss(self.other[0])

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
