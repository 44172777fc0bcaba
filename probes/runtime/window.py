"""The sums of a window of training steps: how many, their time, their samples, and the
logged scalars; the metrics message and the history points are windows' means."""

from __future__ import annotations

from dataclasses import dataclass, field


def training_time(duration: float | None, eval_s: float) -> float | None:
    """A step's duration without the evaluation inside it (None: not timed; also when the
    evaluation, timed on the host, takes all of a duration timed on a device)."""
    if duration is None or not eval_s:
        return duration
    rest = duration - eval_s
    return rest if rest > 0 else None


def timed_sums(
    durations: list[float | None], samples: tuple[int | None, ...]
) -> tuple[int, float, int, float]:
    """Of a run of steps: how many were timed (a positive duration), their time, and the
    samples of those counted, over the time of those. The usual run (every step timed and
    counted) is summed in C; a first step, an evaluation inside a step or samples not counted
    take the loop (a ``None`` among them makes ``sum`` raise: cheaper than looking for it)."""
    try:
        total, counted = sum(durations), sum(samples)  # type: ignore[arg-type]
    except TypeError:
        pass
    else:
        if min(durations) > 0:  # type: ignore[type-var]
            return len(durations), total, counted, total
    timed = counted = 0
    duration_sum = counted_sum = 0.0
    for duration, step_samples in zip(durations, samples, strict=True):
        if duration is not None and duration > 0:
            timed += 1
            duration_sum += duration
            if step_samples is not None:
                counted_sum += duration
                counted += step_samples
    return timed, duration_sum, counted, counted_sum


@dataclass
class StepWindow:
    """Steps whose durations have been resolved since the window was last taken."""

    steps: int = 0
    timed_steps: int = 0
    duration_s: float = 0.0
    timed_samples: int = 0
    counted_s: float = 0.0  # the part of duration_s whose steps' samples were counted
    scalar_sums: dict[str, float] = field(default_factory=dict)
    scalar_counts: dict[str, int] = field(default_factory=dict)

    def add_steps(
        self, steps: int, timed: int, duration_s: float, samples: int, counted_s: float
    ) -> None:
        """``steps`` steps, ``timed`` of them timed (``duration_s`` in all), ``samples`` of
        theirs counted over ``counted_s`` of that time."""
        self.steps += steps
        self.timed_steps += timed
        self.duration_s += duration_s
        self.timed_samples += samples
        self.counted_s += counted_s

    def add_scalars(self, name: str, total: float, count: int) -> None:
        self.scalar_sums[name] = self.scalar_sums.get(name, 0.0) + total
        self.scalar_counts[name] = self.scalar_counts.get(name, 0) + count

    @property
    def step_time_s(self) -> float | None:
        return self.duration_s / self.timed_steps if self.timed_steps else None

    @property
    def samples_per_s(self) -> float | None:
        return self.timed_samples / self.counted_s if self.counted_s > 0 else None

    def scalars(self) -> dict[str, float]:
        return {k: self.scalar_sums[k] / self.scalar_counts[k] for k in self.scalar_sums}
