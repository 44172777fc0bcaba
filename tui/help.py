"""The help (`?`): the keys first, then what this job cannot do and why, then the panels.

What `q` does depends on how the dashboard was opened (``settings.mode``), and the help
says so.
"""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown, Static

from .settings import Mode, interval_text, settings

CLOSE_HINT = "esc or ? closes · ↑ ↓ PgUp PgDn scroll"

KEYS: list[tuple[str, str]] = [
    ("?", "this help"),
    ("+ =", "step the batch size up (double by default; applied at the next step)"),
    ("-", "step the batch size down"),
    (
        "p",
        "probe the largest batch size in a sidecar process (asks first; once a probe has "
        "finished, l in the question shows its result again)",
    ),
    (
        "a",
        "autopilot on / off: the batch follows the noise scale (opt-in; a +/- pauses it); "
        "in the probe's screen, a applies the recommendation",
    ),
    ("t", "where the step time goes (step anatomy) and the verdict"),
    ("r", "every rank of a distributed job, grouped by node (rank 0's monitor)"),
    ("e", "export: summary.md, summary.json and screen.svg in a new directory"),
    ("l", "the Events panel over the whole screen (l or esc: back)"),
    ("j", "back to the job picker, when bsmon found several jobs running"),
    ("[ ]", "redraw more / less often (now every {interval}; --interval SECONDS)"),
    ("ctrl+p", "command palette: every action by name"),
]

QUIT: dict[Mode, list[tuple[str, str]]] = {
    "attach": [("q ctrl+c", "quit the dashboard; the job keeps running")],
    "demo": [("q ctrl+c", "quit and stop the demo job")],
    "run": [
        (
            "q ctrl+c",
            "stop the job (bsmon run sends it ctrl+c) and quit; bsmon run returns "
            "the job's exit code",
        ),
        ("d", "detach: quit and leave the job running (bsmon attach NAME shows it again)"),
    ],
    "replay": [("q ctrl+c", "close the replay")],
}

REPLAY_KEYS: list[tuple[str, str]] = [
    ("space", "replay: pause or play"),
    ("← →", "replay: seek back or forward by a twentieth of the run"),
    ("home end", "replay: the start or the end of the record"),
    ("> <", "replay: play faster or slower"),
]


PANELS = """
**Panels**

- **Devices**: per GPU the utilization and memory meters (NVML), temperature, power, and the
  job's own torch allocator counters (allocated, reserved, peak). `n/a` always says why.
- **Batch**: the current batch size, the mean full-iteration step time, throughput, the memory
  model's *predicted* largest batch (a straight line through the peak memory measured at each
  size the job ran), and the last changes with the throughput each one bought. With the
  autopilot on (`a`), its line: the target √(B½·B_simple), B½ of the step-time fit (`~`:
  assumed equal to the size while only one size is measured), the gain it claims against the
  batch it was switched on at (over the steps it drove; none before its first change), the
  rule that holds it at its last look ("holds: 1.03× < 1.05×"), or why it is paused.
- **Noise scale**: the gradient noise scale B_simple = tr(Σ)/|G|² (McCandlish et al. 2018),
  estimated inside the job, ± its standard error. At batch B a step is worth B/(B+B_simple)
  of a noiseless step: raising the batch toward B_simple cuts the steps needed at little
  cost in samples; far above it a larger batch wastes compute. An order-of-magnitude guide
  for the current learning rate, not a prescription. The chart: B_simple on a log scale,
  its 95% band and the batch size. The estimator is named: per-example norms (default),
  micro-batches (gradient accumulation), DDP ranks, or `sequential`, which is **biased** and
  only for comparison. "collecting" until enough steps are measured.
- **Step time · throughput**: per step, over the whole run (left axis ms, right samples/s).
- **Loss**: the scalars the job logs with `mon.log(loss=...)`; under `bsmon run`, the value
  the script calls `backward()` on (divided for accumulation, or scaled by AMP, if it is).
- **Events**: what happened, with the time into the run and the step (`l` enlarges it).
- **Time** (`t`): where each step's time goes — waiting for data, forward, backward, the
  all-reduce wait (DDP), the optimizer step and the rest — over the last 100 steps and over
  the run, and the verdict: input-, communication-, host- or compute-bound, with what to try.
  Wall clock on a CPU, CUDA events on a GPU; a phase bsmon cannot see is "not measured".

Without colour (`NO_COLOR`), the charts tell their series apart by marker; the legend shows
which is which.

**Safety**

A key the job cannot serve is greyed in the footer (`r` is left out for a single process);
pressing it says why. The monitor never
acts on the job unless you press a key that says so. A size the memory model predicts above
90% of device memory, above a probe's maximum, or that already ran out of memory asks for
confirmation first. `bsmon --readonly` removes every key that acts on the job.
"""


def quit_help(mode: Mode) -> str:
    """What quitting does in ``mode``, as the palette's Quit says it."""
    text = QUIT[mode][0][1]
    return f"{text[0].upper()}{text[1:]} (q)"


def key_rows(mode: Mode, replay: bool = False) -> list[tuple[str, str]]:
    """The keys of this dashboard, in the order the help lists them."""
    interval = interval_text(settings.interval_s)
    rows = [(key, action.format(interval=interval)) for key, action in KEYS]
    if replay or mode == "replay":
        rows += REPLAY_KEYS
    return rows + QUIT[mode]


def keys_table(rows: list[tuple[str, str]]) -> Table:
    table = Table(box=None, show_header=False, expand=True, padding=(0, 1))
    table.add_column(style="bold", no_wrap=True, width=8)
    table.add_column(ratio=1)
    for key, action in rows:
        table.add_row(key, action)
    return table


def details(keys_off: dict[str, str]) -> str:
    """After the keys, in Markdown: this job's greyed keys and why, then the panels."""
    if not keys_off:
        return PANELS
    off = "\n".join(f"- `{key}` is off: {why}." for key, why in keys_off.items())
    return f"**This job**\n\n{off}\n{PANELS}"


def help_text(keys_off: dict[str, str], mode: Mode, replay: bool = False) -> str:
    """The whole help as text: the keys, then ``details``."""
    keys = "\n".join(f"{key:<9} {action}" for key, action in key_rows(mode, replay))
    return f"bsmon: keys\n\n{keys}\n\n{details(keys_off)}"


class HelpScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape,question_mark,q", "dismiss", "Close", id="close_help"),
    ]

    def __init__(self, keys_off: dict[str, str] | None = None, replay: bool = False) -> None:
        super().__init__()
        self.keys_off = keys_off or {}
        self.replay = replay

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Static(keys_table(key_rows(settings.mode, self.replay)), id="help-keys")
            yield Markdown(details(self.keys_off))
        yield Static(CLOSE_HINT, id="help-hint")

    def text(self) -> str:
        return help_text(self.keys_off, settings.mode, self.replay)

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)
