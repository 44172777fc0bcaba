"""When a probe's sidecar ran, read from the record's events (``probe_started``, then its
``probe_result``): a span it overlaps measured the job beside the sidecar, which shares its
device (or its CPU cores), not the job at its batch size. The live batch watch leaves out the
same windows (probes/batch/watch.py, docs/batch-control.md).

The agent writes a tick's events before the span that tick closes, and compaction only merges
spans (a merged span may follow events inside it), so a probe that began before a span ended
is known when the span is read. Old records have these events too.
"""

from __future__ import annotations

from collections import deque

from ..wire.protocol import Event


class ProbeRuns:
    """The probes' [start, end] intervals seen so far; spans come in time order."""

    def __init__(self) -> None:
        self._runs: deque[tuple[float, float]] = deque()
        self._since: float | None = None  # a probe that started and has no result yet

    def see(self, event: Event) -> None:
        if event.kind == "probe_started" and self._since is None:
            self._since = event.t
        elif event.kind == "probe_result" and self._since is not None:
            self._runs.append((self._since, event.t))
            self._since = None

    def shared(self, t0: float, t1: float) -> bool:
        """A probe ran at some time within [t0, t1]."""
        while self._runs and self._runs[0][1] <= t0:  # over before this span and every later one
            self._runs.popleft()
        if self._since is not None and self._since < t1:
            return True
        return any(start < t1 for start, _end in self._runs)
