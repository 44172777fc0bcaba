"""Recommendations drawn from a session's summary: plain rules, each with its basis stated.

They are suggestions, not findings: a noise scale is an estimate, and a batch size that was
not run is a prediction, never "fits" (DESIGN.md's rule).
"""

from __future__ import annotations

import math

from ..batch import verdict
from ..wire import describe
from .schema import Note, Summary

LOW_UTIL_PERCENT = 60.0
ROOMY_MEMORY = 0.5
FULL_MEMORY = 0.95
SPIKY_RATIO = 3.0


def recommendations(summary: Summary) -> list[Note]:
    notes: list[Note] = []
    final = summary.batch_size_history[-1].batch_size if summary.batch_size_history else None
    _noise_scale(summary, final, notes)
    _devices(summary, notes)
    _spikes(summary, notes)
    _best_size(summary, notes)
    _probe(summary, notes)
    _anatomy(summary, notes)
    _diverged(summary, notes)
    return notes


def _anatomy(summary: Summary, notes: list[Note]) -> None:
    """Where the step time went, when something other than the model's own work is to blame."""
    anatomy = summary.anatomy
    if anatomy is None or anatomy.verdict in (None, "compute-bound"):
        return
    kind = "step_" + anatomy.verdict.replace("-", "_")
    notes.append(Note(kind, f"{anatomy.verdict}: {anatomy.evidence}; try: {anatomy.advice}"))


def _noise_scale(summary: Summary, batch: int | None, notes: list[Note]) -> None:
    b_simple = summary.b_simple.end
    if b_simple is None or batch is None or b_simple <= 0:
        return
    ranks = summary.run.world_size  # B_simple counts a step's examples, on every rank
    said = describe.noise_verdict(batch * ranks, b_simple)
    step = describe.step_batch(batch, ranks)
    if said == describe.RAISE:
        notes.append(
            Note(
                "batch_below_noise_scale",
                f"the batch size ({step}) is well below the estimated noise scale "
                f"B_simple ≈ {b_simple:,.0f}: a larger batch, up to about {b_simple:,.0f}, would "
                "likely need fewer steps for the same progress at little cost per sample "
                "(an estimate, counting steps alone: the final word above weighs the step time "
                "and the guards too)",
            )
        )
    elif said == describe.TOO_BIG:
        notes.append(
            Note(
                "batch_above_noise_scale",
                f"the batch size ({step}) is well above the estimated noise scale "
                f"B_simple ≈ {b_simple:,.0f}: past it, larger batches buy little per sample; a "
                f"smaller batch near {b_simple:,.0f} may reach the same loss with less compute "
                "(an estimate, counting samples alone: the final word above weighs the step time "
                "and the guards too)",
            )
        )


def _devices(summary: Summary, notes: list[Note]) -> None:
    for device in summary.devices:
        util = device.util_mean_percent
        if util is not None and util < LOW_UTIL_PERCENT:
            notes.append(
                Note(
                    "low_gpu_utilization",
                    f"GPU{device.index} was busy {util:.0f}% of the time on average: the job may "
                    "be waiting on input (data loading, host-to-device copies); try more "
                    "DataLoader workers, pin_memory=True, or a larger batch",
                )
            )
        fraction = device.memory_peak_fraction
        if fraction is None:
            continue
        if fraction >= FULL_MEMORY:
            notes.append(
                Note(
                    "memory_near_full",
                    f"GPU{device.index} memory peaked at {fraction:.0%}: close to running out; "
                    "probe before raising the batch size",
                )
            )
        elif fraction < ROOMY_MEMORY:
            notes.append(
                Note(
                    "memory_headroom",
                    f"GPU{device.index} memory peaked at {fraction:.0%}: there is probably room "
                    "for a larger batch (a prediction, not tested: `bsmon probe` measures it)",
                )
            )


def _spikes(summary: Summary, notes: list[Note]) -> None:
    """Slow outliers: the slowest 1% of the steps, or under 100 steps the slowest one (a
    share of steps would name less than one)."""
    st = summary.step_time_s
    if st.timed_steps < 100:
        which, slow = f"the slowest of the {st.timed_steps} timed steps took", st.max
    else:
        which, slow = "1% of steps took over", st.p99
    if st.p50 and slow and slow > SPIKY_RATIO * st.p50:
        notes.append(
            Note(
                "step_time_spikes",
                f"{which} {slow / st.p50:.1f}× the median step time "
                f"({slow * 1e3:.1f} ms vs {st.p50 * 1e3:.1f} ms): look for stalls (data "
                "loading, checkpoints, logging, garbage collection)",
            )
        )


def _best_size(summary: Summary, notes: list[Note]) -> None:
    """The fastest size, only when the throughput noise resolves it from the runner-up (the
    rule of the live verdicts, probes/batch/verdict.py)."""
    sizes = [s for s in summary.batch_sizes if s.samples_per_s and s.batch_size is not None]
    if len(sizes) < 2:
        return
    ranked = sorted(sizes, key=lambda s: s.samples_per_s or 0.0, reverse=True)
    best, second = ranked[0], ranked[1]
    steps = best.steps - best.left_out_steps  # those a probe shared say nothing of the size
    measured = f"{best.samples_per_s:,.0f} samples/s, measured over {steps:,} steps"
    se = [s.samples_per_s_se for s in (best, second)]
    if None not in se and (best.samples_per_s - second.samples_per_s) <= verdict.Z * math.hypot(
        *se  # type: ignore[arg-type]
    ):
        notes.append(
            Note(
                "no_fastest_batch_size",
                f"the fastest batch sizes this run used, {best.batch_size:,} ({measured}) and "
                f"{second.batch_size:,} ({second.samples_per_s:,.0f}), differ by less than the "
                "step-time noise resolves: no measurable difference",
            )
        )
        return
    notes.append(
        Note(
            "fastest_batch_size",
            f"of the batch sizes this run used, {best.batch_size:,} reached the highest "
            f"throughput ({measured})",
        )
    )


def _diverged(summary: Summary, notes: list[Note]) -> None:
    """A loss that diverged after a batch-size change and stayed up (the job's warning names
    the change; one that recovered has given way to its ``loss_recovered`` note: no advice)."""
    for warning in summary.warnings:
        if warning.kind == "loss_diverged":
            notes.append(
                Note(
                    "loss_diverged_after_batch_change",
                    f"{warning.message}. Going back to the earlier batch size may not undo it: "
                    "restore a checkpoint from before that step, or change the batch in smaller "
                    "steps",
                    warning.step,
                    warning.t_s,
                )
            )


def _probe(summary: Summary, notes: list[Note]) -> None:
    """The last probe's own recommendation, when it made one."""
    for probe in reversed(summary.probes):
        recommendation = probe.get("recommendation")
        if probe.get("status") == "ok" and isinstance(recommendation, dict):
            size = recommendation.get("batch_size")
            reasons = "; ".join(recommendation.get("reasons") or [])
            if size:
                stay = recommendation.get("current") == size
                said = f"staying at batch size {size:,}" if stay else f"batch size {size:,}"
                notes.append(
                    Note(
                        "probe_recommendation",
                        f"the probe at step {probe.get('step', 0):,} recommended {said} (the "
                        "advice then)" + (f": {reasons}" if reasons else ""),
                    )
                )
            return
