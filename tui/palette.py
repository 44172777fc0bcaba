"""bsmon's own actions in the command palette (ctrl+p), beside Textual's (theme, quit...).

Each runs as its key does; one the job cannot serve now says why, as the greyed key does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from textual.app import SystemCommand

if TYPE_CHECKING:
    from .screens import DashboardScreen

# title, help line, action, arguments
COMMANDS: tuple[tuple[str, str, str, tuple[object, ...]], ...] = (
    ("Help: keys", "Every key, what this job cannot do and why (?)", "help", ()),
    ("Batch size up", "Double the batch size at the next step (+)", "batch", ("up",)),
    ("Batch size down", "Halve the batch size at the next step (-)", "batch", ("down",)),
    (
        "Probe the largest batch size",
        "Measure it in a sidecar process; asks first (p)",
        "probe",
        (),
    ),
    (
        "Probe: the last result",
        "The probe screen with the last probe's result, without probing (p, then l)",
        "probe_result",
        (),
    ),
    (
        "Autopilot on / off",
        "The batch follows the noise scale (opt-in; a +/- pauses it) (a)",
        "autopilot",
        (),
    ),
    ("Step anatomy: where the time goes", "The step split and the verdict (t)", "anatomy", ()),
    ("Ranks of a distributed job", "Every rank, grouped by node (r)", "ranks", ()),
    ("Export the session", "summary.md, summary.json and screen.svg (e)", "export", ()),
    ("Events: full screen", "The Events panel over the dashboard, or back (l)", "events", ()),
    ("Jobs: pick another job", "Back to the job picker (j)", "jobs", ()),
    (
        "Detach: leave the job running",
        "Close the dashboard; the job bsmon run started goes on (d)",
        "detach",
        (),
    ),
    ("Refresh interval: longer", "Redraw less often, for less CPU (])", "interval", (1,)),
    ("Refresh interval: shorter", "Redraw more often ([)", "interval", (-1,)),
)


def dashboard_commands(screen: DashboardScreen) -> Iterator[SystemCommand]:
    for title, help_line, action, args in COMMANDS:
        yield SystemCommand(title, help_line, lambda a=action, x=args: screen.run_or_explain(a, *x))
