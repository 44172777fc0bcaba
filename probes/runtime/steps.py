"""Resolved training steps as the agent thread hands them on: one (``StepDone``) or a run of
them as columns (``StepRun``), from the telemetry to its tap (the recorder) and its duration
listeners (the noise budget)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from ..anatomy.seconds import Phases


class StepDone(NamedTuple):
    """One resolved training step (``Recorder.on_step``; the telemetry hands its steps over
    as ``StepRun`` columns)."""

    step: int
    duration: float | None  # training seconds (evaluation taken out); None: not timed
    samples: int | None  # None: not counted
    batch_size: int | None
    eval_s: float = 0.0
    phases: Phases | None = None


class StepRun(NamedTuple):
    """Consecutive resolved training steps as columns, each with one item a step, as the
    telemetry hands a poll's steps to its tap (the recorder) and duration listeners (the
    noise budget): a list per field, not a tuple per step, which the agent thread would
    make and take apart again while the training thread waits for the GIL."""

    steps: range
    durations: list[float | None]  # as ``StepDone.duration``
    samples: list[int | None]
    sizes: list[int | None]
    eval_s: list[float]
    phases: list[Phases | None] | None = None  # None: no step of them was sampled

    @classmethod
    def of(cls, done: StepDone) -> StepRun:
        return cls(
            range(done.step, done.step + 1),
            [done.duration],
            [done.samples],
            [done.batch_size],
            [done.eval_s],
            None if done.phases is None else [done.phases],
        )

    def part(self, start: int, stop: int) -> StepRun:
        return StepRun(*(None if c is None else c[start:stop] for c in self))  # type: ignore[arg-type]
