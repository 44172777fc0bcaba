"""``e`` in the dashboard: the session's summary and a screenshot, in a fresh directory.

The summary comes from the job's record (its path is in ``hello.session.record``). When there
is no record to read (the job does not record, or the file is not readable from here), it is
made from what the dashboard holds: its ~1 s history, events and latest readings, and the
summary says so. The screen takes the screenshot and calls ``export_session`` on a worker
thread: this module needs only a snapshot and a directory.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from bsmon.probes.record import RECORD_VERSION, End, Header, RecordError, conversions
from bsmon.probes.summary import (
    Note,
    Source,
    Summary,
    mark_running,
    summarize_items,
    summarize_record,
    write_summary,
)
from bsmon.probes.wire import discovery
from bsmon.probes.wire.protocol import SessionInfo

from .session import ConnState, Snapshot


def export_base(session: SessionInfo) -> Path:
    """Where ``e`` writes by default: beside the job's record (a directory that survives logout
    and reboot, and never the current directory, which may be a repository checkout), else
    the records directory."""
    if session.record:
        return Path(session.record).parent
    return discovery.records_dir()


def export_directory(base: Path, name: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:40] or "job"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = base / f"bsmon-{safe}-{stamp}"
    serial = 1
    while path.exists():
        serial += 1
        path = base / f"bsmon-{safe}-{stamp}-{serial}"
    return path


def export_session(snap: Snapshot, directory: Path) -> Summary:
    """Write the session's summary.json and summary.md into ``directory``; returns it."""
    summary = summary_for(snap)
    if snap.state is ConnState.LIVE and not summary.run.complete:
        mark_running(summary)
    write_summary(summary, directory / "summary.json", directory / "summary.md")
    return summary


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
    spans = list(conversions.spans_from_points(snap.points, session.start_time))
    latest = snap.latest
    if latest is not None:
        t = max(latest.t, spans[-1].t1 if spans else session.start_time)
        spans.append(conversions.latest_span(latest, t))
    # events first, as in a record: the spans a probe ran in are known when they are read
    items: list[object] = [*snap.events, *spans]
    if snap.state is ConnState.FINISHED:
        step = latest.step if latest else 0
        items.append(
            End(t=snap.now, reason=snap.detail, step=step, samples=(latest and latest.samples) or 0)
        )
    return summarize_items(header, Source(kind="dashboard"), items)
