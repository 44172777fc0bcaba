"""Batch size and what it buys: step time, throughput, samples seen."""

from __future__ import annotations

from textual.widgets import Static

from .. import format as fmt
from ..session import Snapshot


class BatchPanel(Static):
    DEFAULT_CSS = "BatchPanel { height: auto; }"

    def show(self, snap: Snapshot) -> None:
        m = snap.latest
        if m is None:
            self.update("[$text-muted]no steps yet[/]")
            return
        batch = f"[b]{m.batch_size:,}[/b]" if m.batch_size is not None else "n/a"
        idle = ""
        if m.idle_s is not None and m.idle_s >= 5 and snap.state.value == "live":
            idle = f"\n[$warning]no step for {fmt.duration(m.idle_s)}[/]"
        self.update(
            f"batch   {batch}\n"
            f"step    {fmt.duration(m.step_time_s)}\n"
            f"speed   {fmt.rate(m.samples_per_s, ' samples/s')}\n"
            f"seen    {fmt.count(m.samples)} samples{idle}"
        )
