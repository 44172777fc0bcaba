"""Batch size and what it buys: step time, throughput, the memory model's prediction, and the
history of changes with the throughput each one bought."""

from __future__ import annotations

from textual.markup import escape
from textual.widgets import Static

from bsmon.probes.wire.protocol import (
    Advice,
    AutopilotReading,
    BatchChange,
    BatchReading,
    Metrics,
    StepAnatomy,
    ThroughputReading,
)

from .. import format as fmt
from ..disabled import keys_off
from ..session import ConnState, Snapshot

HISTORY_LINES = 3


def size_line(m: Metrics) -> str:
    batch = m.batch
    text = f"[b]{m.batch_size:,}[/b]" if m.batch_size is not None else "n/a"
    if m.batch_varies:
        text += f" [$text-muted]({m.batch_varies})[/]"
    if batch.accumulation_steps:
        text += f" = {batch.accumulation_steps}×{batch.micro_batch_size}"
    if batch.pending is not None:
        text += f" [$warning]→ {batch.pending:,} {batch.applies_at or 'at the next step'}[/]"
    return text


def headline(anatomy: StepAnatomy | None) -> str | None:
    """The step anatomy's verdict in a few words for the step line (None: no verdict yet)."""
    if anatomy is None or anatomy.verdict is None:
        return None
    colour = "$success" if anatomy.verdict == "compute-bound" else "$warning"
    short = anatomy.verdict.replace("communication", "comm")
    return f"[{colour}]{short}[/]"  # the footer's `t Time` opens the breakdown


def memory_line(batch: BatchReading, gpu: bool) -> str:
    if batch.accumulation_steps:
        return "memory  constant (accumulation mode)"
    if not gpu:
        return "memory  [$text-muted]n/a (no GPU to model)[/]"
    measured = len(batch.memory)
    if batch.predicted_max is None:
        need = "two sizes" if measured < 2 else "a budget"
        return f"memory  [$text-muted]model needs {need} ({measured} measured)[/]"
    return f"memory  max ≈ [b]{batch.predicted_max:,}[/b] [$text-muted](predicted)[/]"


def probe_line(m: Metrics) -> str | None:
    reading = m.probe
    if reading.status == "running":
        return f"probe   [$warning]running[/] — {reading.message}"
    result = reading.result
    if result is None:
        return None
    if result.status != "ok":
        return f"probe   [$error]{result.status}[/] (p for details)"
    predicted = f" · ≈{result.predicted_max:,} pred." if result.predicted_max else ""
    return f"probe   {result.max_batch_size:,} ran{predicted}"


def change_line(change: BatchChange) -> str:
    """One change: its step, sizes, what it bought once resolved from the noise (or why not
    yet), and a loss that diverged after it (or diverged and came back: "recovered")."""
    before, after = change.samples_per_s_before, change.samples_per_s_after
    if change.verdict == "left before a verdict":
        bought = "[$text-muted]left before a verdict[/]"
    elif change.verdict == "no measurable difference":
        bought = "[$text-muted]no measurable difference[/]"
    elif change.verdict == "too little measured before it" and after:
        bought = f"{fmt.rate(after)} [$text-muted](not compared)[/]"
    elif before and after:
        bought = f"{after / before - 1:+.0%} samples/s"
    elif after:
        bought = f"{fmt.rate(after)}"
    else:
        bought = "[$text-muted]measuring…[/]"
    if change.loss == "diverged":
        bought = f"[$error]loss diverged[/] · {bought}"
    elif change.loss == "recovered":
        bought = f"[$warning]recovered[/] · {bought}"  # "loss recovered" is cut at 80 columns
    marker = "[$warning]![/]" if change.source == "oom guard" else " "
    return f"{marker}s{change.step:<6} {change.old}→{change.new}  {bought}"


def autopilot_lines(reading: AutopilotReading | None, advice: Advice | None = None) -> list[str]:
    """The autopilot at a glance (nothing while it is off): where it steers, what it claims
    and its model, and the rule that holds it (the agent's words; not again when the advice
    above says it), or why it does not steer."""
    if reading is None or reading.state == "off":
        return []
    if reading.state != "on":
        return [f"auto    [$warning]{reading.state}[/] [$text-muted]({reading.why or '?'})[/]"]
    steer = [f"→ {reading.target:,}"] if reading.target is not None else []
    if reading.claimed_gain is not None:
        steer.append(f"[b]{reading.claimed_gain:.2f}×[/b] vs {reading.start_size:,}")
    model = []
    if reading.half_batch_how is not None:
        half = fmt.count(reading.half_batch) if reading.half_batch is not None else "∞"
        assumed = "~" if "assumed" in reading.half_batch_how else ""  # fits 80 columns
        model.append(f"B½ {assumed}{half}")
    if reading.next_decision_step is not None:
        model.append(f"next s{reading.next_decision_step:,}")
    first = " · ".join(steer) if steer else f"[$text-muted]{reading.waiting or ''}[/]"
    lines = [f"auto    [$success]on[/] {first}"]
    if model:
        lines.append(f"        [$text-muted]{' · '.join(model)}[/]")
    said = advice is not None and reading.held == f"holds: {advice.why}"
    if steer and reading.held and not said:  # without a target the waiting line says it
        lines.append(f"        [$warning]{reading.held}[/]")
    return lines


ADVICE_COLOURS = {"raise": "$success", "lower": "$success", "back": "$error", "wait": "$text-muted"}


def advice_line(advice: Advice | None) -> str | None:
    """The advisor's answer, and below it the short form of the reason that decided it (the
    agent's words: the panel decides nothing). None: a job or record from before the
    advisor."""
    if advice is None:
        return None
    colour = ADVICE_COLOURS.get(advice.action, "$text")
    return f"advice  [{colour}][b]{advice.headline}[/b][/]\n        [$text-muted]{advice.why}[/]"


def off_line(snap: Snapshot) -> str | None:
    """One line for the greyed keys; their reasons are in the help (``?``)."""
    off = keys_off(snap)
    return f"[$text-muted]{' '.join(off)} off — ? says why[/]" if off else None


def throughput_line(reading: ThroughputReading | None) -> str | None:
    """Tokens/s and MFU where the job has them ("tokens  1.05M tok/s · MFU 41.2%"); None
    where it has neither (their reasons are in the metrics and ``mon.stats()``)."""
    if reading is None:
        return None
    mfu = f"{100 * reading.mfu:.1f}%" if reading.mfu is not None else None
    if reading.tokens_per_s is None:
        return f"MFU     {mfu}" if mfu is not None else None
    tokens = f"tokens  {fmt.rate(reading.tokens_per_s, ' tok/s')}"
    return f"{tokens} · MFU {mfu}" if mfu is not None else tokens


def mfu_note_line(reading: ThroughputReading | None) -> str | None:
    """Beside the tokens, why there is no MFU, in the agent's words ("MFU     n/a: the model
    runs on the CPU (no peak FLOP/s)"); None where MFU is shown or there are no tokens."""
    if reading is None or reading.tokens_per_s is None or reading.mfu is not None:
        return None
    if not reading.mfu_note:
        return None
    return f"MFU     [$text-muted]{escape(reading.mfu_note.removeprefix('MFU '))}[/]"


class BatchPanel(Static):
    DEFAULT_CSS = "BatchPanel { height: auto; }"

    def show(self, snap: Snapshot) -> None:
        m = snap.latest
        if m is None:
            self.update("[$text-muted]no steps yet[/]")
            return
        speed = f"speed   {fmt.rate(m.samples_per_s, ' samples/s')}"
        if m.samples_note:
            speed += " [$text-muted](samples not counted: see Events)[/]"
        step = f"step    {fmt.duration(m.step_time_s)}"
        if (why := headline(m.anatomy)) is not None:
            step += f" · {why}"
        lines = [f"batch   {size_line(m)}"]
        if (advice := advice_line(m.advice)) is not None:
            lines.append(advice)  # second: in view at 80×24 (issue 41)
        lines += [step, speed]
        if (tokens := throughput_line(m.throughput)) is not None:
            lines.append(tokens)
        if (no_mfu := mfu_note_line(m.throughput)) is not None:
            lines.append(no_mfu)
        lines.append(f"seen    {fmt.count(m.samples)} samples")
        if m.ranks is not None and m.ranks.global_batch_size is not None:
            lines.append(f"global  {m.ranks.global_batch_size:,} over {m.ranks.world_size} ranks")
        if m.idle_s is not None and m.idle_s >= 5 and snap.state is ConnState.LIVE:
            lines.append(f"[$warning]no step for {fmt.duration(m.idle_s)}[/]")
        batch = m.batch
        if batch.control:
            lines.append(memory_line(batch, gpu=bool(m.devices)))
            if (probe := probe_line(m)) is not None:
                lines.append(probe)
        lines.extend(autopilot_lines(m.autopilot, m.advice))  # a replay rebuilds it from the events
        lines.extend(change_line(c) for c in batch.changes[-HISTORY_LINES:])
        if (line := off_line(snap)) is not None:
            lines.append(line)
        self.update("\n".join(lines))
