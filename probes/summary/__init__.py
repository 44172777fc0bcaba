"""The summary of a session: built from its record, written as summary.json and summary.md.

Modules, one job each:

- ``schema``: the shape of summary.json, version 1 (docs/summary.md);
- ``build``: the summary computed from a record in one streaming pass, and written;
- ``probe_runs``: when a probe's sidecar ran, from the record's events: the spans the
  per-size throughput leaves out;
- ``recommend``: recommendations drawn from a summary, each with its basis stated;
- ``markdown``: summary.md, for a person; ``text_charts``: its charts, drawn by plotext;
  ``final_word``: its section on the advisor's answer as the job ended; ``figures``: its
  numbers in words.

This package is the dashboard's face on summaries: it imports neither torch nor textual.
"""

from __future__ import annotations

from .build import mark_running, paths_beside, summarize_items, summarize_record, write_summary
from .schema import Note, Source, Summary

__all__ = [
    "Note",
    "Source",
    "Summary",
    "mark_running",
    "paths_beside",
    "summarize_items",
    "summarize_record",
    "write_summary",
]
