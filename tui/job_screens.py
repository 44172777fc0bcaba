"""The screens before a job is chosen: the picker when several run, and the no-job screen
that waits for one."""

from __future__ import annotations

from pathlib import Path

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.markup import escape
from textual.screen import Screen
from textual.widgets import Footer, Markdown, OptionList, Static
from textual.widgets.option_list import Option

from bsmon.probes.wire import JobEntry

from . import format as fmt


class PickerScreen(Screen[Path]):
    """Several jobs are running: choose one."""

    BINDINGS = [Binding("escape", "app.quit", "Quit", id="picker_quit", show=False)]  # q says it

    def __init__(self, jobs: list[JobEntry], now: float) -> None:
        super().__init__()
        self.jobs = jobs
        self.now = now

    def compose(self) -> ComposeResult:
        yield Static(
            "[b]bsmon[/b] — several training jobs are running; pick one (↑↓, enter)",
            id="picker-title",
        )
        yield OptionList(
            *[Option(self.describe(job), id=str(i)) for i, job in enumerate(self.jobs)], id="jobs"
        )
        yield Footer()

    def describe(self, job: JobEntry) -> str:
        age = fmt.clock(self.now - job.start_time) if job.start_time else "n/a"
        return f"{escape(job.name):<20} pid {job.pid:<8} {escape(job.host):<16} up {age}"

    @on(OptionList.OptionSelected)
    def _chosen(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.jobs[int(event.option.id or 0)].socket)


NO_JOBS_TEXT = """\
# No training job is running

bsmon shows jobs that have the agent attached. Run a script unchanged under bsmon:

```
bsmon run -- python train.py
```

or attach it in the script:

```python
from bsmon.probes import attach

mon = attach(model, optimizer, batch_size=64)
loader = mon.dataloader(dataset, shuffle=True)
for x, y in loader:
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    mon.log(loss=loss)
```

or try it on a demo job: `bsmon demo`

This screen attaches by itself when a job appears (looking in `{directory}`).
"""


class NoJobsScreen(Screen[None]):
    BINDINGS = [Binding("q", "app.quit", "Quit", id="empty_quit")]

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="empty-box"):
            yield Markdown(NO_JOBS_TEXT.format(directory=self.directory))
        yield Footer()
