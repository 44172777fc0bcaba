"""The record: the session kept on disk, read back, and turned to and from live readings.

Modules, one job each:

- ``format``: the record's lines, format version 1 (JSON Lines; docs/record.md);
- ``recorder``: spans built on the agent thread from every step, scalar, event and sample;
- ``writer``: where a record goes, and the thread that does its file I/O;
- ``reader``: a record read back (export, replay, the summary), a torn last line allowed;
- ``buckets``: mergeable aggregates (min/mean/max stats, histograms, compaction);
- ``history``: a bounded history at a uniform, coarsening resolution (agent and dashboard);
- ``conversions``: live readings ↔ record spans, for export and replay.

This package is the dashboard's face on the record: it imports neither torch nor textual
(``recorder`` and ``writer`` run in the job and are not exported here). ``conversions`` is
imported on demand (``from bsmon.probes.record import conversions``): it reads the step
anatomy's verdict, which a reader of spans alone need not load.
"""

from __future__ import annotations

from .format import (
    RECORD_VERSION,
    DeviceSpan,
    End,
    Header,
    HostSpan,
    Span,
    Stat,
    Status,
    span_throughput,
)
from .history import DecimatingHistory, merge_points, metrics_history
from .reader import RecordError, open_record

__all__ = [
    "RECORD_VERSION",
    "DecimatingHistory",
    "DeviceSpan",
    "End",
    "Header",
    "HostSpan",
    "RecordError",
    "Span",
    "Stat",
    "Status",
    "conversions",
    "merge_points",
    "metrics_history",
    "open_record",
    "span_throughput",
]
