"""``e`` in the dashboard: the session's summary and a screenshot, in a fresh directory.

The summary comes from the job's record (its path is in ``hello.session.record``). When there
is no record to read (the job does not record, or the file is not readable from here), it is
made from what the dashboard holds: its ~1 s history, events and latest readings, and the
summary says so. The screenshot is taken at once; the summary is written on a worker thread.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

from bsmon.probes.record import RECORD_VERSION, End, Header, RecordError, conversions
from bsmon.probes.summary import (
    Note,
    Source,
    Summary,
    summarize_items,
    summarize_record,
    write_summary,
)

from .session import ConnState, Snapshot

if TYPE_CHECKING:
    from .screens import DashboardScreen


def export_directory(base: Path, name: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:40] or "job"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = base / f"bsmon-{safe}-{stamp}"
    serial = 1
    while path.exists():
        serial += 1
        path = base / f"bsmon-{safe}-{stamp}-{serial}"
    return path


def start_export(screen: DashboardScreen) -> None:
    """Save the screenshot now and write the summary on a worker thread (UI thread)."""
    app = screen.app
    snap = screen.snapshot
    if snap is None or snap.session is None:
        app.notify("nothing to export yet: no job on screen", severity="warning")
        return
    base = getattr(app, "export_dir", None) or Path.cwd()
    directory = export_directory(Path(base), snap.session.name)
    try:
        directory.mkdir(parents=True)
        app.save_screenshot(filename="screen.svg", path=str(directory))
    except OSError as exc:
        app.notify(f"cannot export to {directory}: {exc.strerror or exc}", severity="error")
        return

    def work() -> None:
        try:
            summary = summary_for(snap)
            write_summary(summary, directory / "summary.json", directory / "summary.md")
        except Exception as exc:  # shown, never raised into the app
            message = f"export failed: {exc}; the screenshot is in {directory}"
            app.call_from_thread(app.notify, message, severity="error", timeout=10)
            return
        how = "from the record" if summary.source.kind == "record" else "from the dashboard's data"
        message = f"exported {how} to {directory}/: summary.md, summary.json, screen.svg"
        app.call_from_thread(app.notify, message, title="Export", timeout=12)

    screen.run_worker(work, thread=True, name="export", exit_on_error=False)


def summary_for(snap: Snapshot) -> Summary:
    """From the job's record when it can be read, else from the snapshot (noted)."""
    session = snap.session
    assert session is not None
    if session.record:
        try:
            return summarize_record(session.record)
        except RecordError as exc:
            why = f"the job's record could not be read here ({exc})"
    else:
        why = "the job does not write a record (attach(record=False))"
    summary = summary_from_snapshot(snap)
    summary.warnings.insert(
        0,
        Note(
            "from_dashboard",
            f"made from what the dashboard held, because {why}: step-time percentiles are over "
            "~1 s means, and device figures are the latest readings only",
        ),
    )
    return summary


def summary_from_snapshot(snap: Snapshot) -> Summary:
    session = snap.session
    assert session is not None
    header = Header(
        format="bsmon-record",
        version=RECORD_VERSION,
        created=snap.now,
        session=session,
        capabilities=dict(snap.capabilities),
    )
    items: list[object] = list(conversions.spans_from_points(snap.points, session.start_time))
    latest = snap.latest
    if latest is not None:
        t = max(latest.t, items[-1].t1 if items else session.start_time)  # type: ignore[attr-defined]
        items.append(conversions.latest_span(latest, t))
    items.extend(snap.events)
    if snap.state is ConnState.FINISHED:
        step = latest.step if latest else 0
        items.append(
            End(t=snap.now, reason=snap.detail, step=step, samples=(latest and latest.samples) or 0)
        )
    return summarize_items(header, Source(kind="dashboard"), items)
