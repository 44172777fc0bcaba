"""What a step costs on this machine: the step time at each batch size (the calibration of
benchmarks/autopilot.py), and the autopilot's own cost on it (``--cost``, goal C5)."""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader

from .tasks import Task, whole_batch
from .training import train_step


def step_times(
    task: Task, sizes: list[int], *, seconds: float = 0.4, repeats: int = 3
) -> dict[int, float]:
    """This machine's time per training step (data, forward, backward, SGD step) at each
    batch size: the fastest of ``repeats`` timings of about ``seconds`` each, after a warm-up."""
    data = task.data()
    torch.manual_seed(0)
    model = task.model()
    optimizer = task.optimizer(model.parameters(), 1e-4)
    result = {}
    for size in sizes:
        loader = DataLoader(
            data.train,
            batch_size=size,
            shuffle=True,
            drop_last=True,
            generator=torch.Generator().manual_seed(0),
            collate_fn=whole_batch,
        )
        batches = iter(loader)

        def one_step(loader: DataLoader = loader) -> None:
            nonlocal batches
            try:
                inputs, labels = next(batches)
            except StopIteration:
                batches = iter(loader)
                inputs, labels = next(batches)
            train_step(task, model, optimizer, inputs, labels)

        for _ in range(10):
            one_step()
        started = time.perf_counter()
        one_step()
        count = max(5, int(seconds / max(time.perf_counter() - started, 1e-6)))
        timings = []
        for _ in range(repeats):
            started = time.perf_counter()
            for _ in range(count):
                one_step()
            timings.append((time.perf_counter() - started) / count)
        result[size] = min(timings)
        print(
            f"  [{task.name}] t({size}) = {result[size] * 1e3:.3f} ms "
            f"(spread {statistics.pstdev(timings) / result[size]:.0%})",
            file=sys.stderr,
        )
    return result


COST_CONFIGS = {
    "bsmon, noise scale off": {"noise_scale": None},
    "bsmon, noise scale on its budget": {},
    "bsmon, noise scale + autopilot": {"autopilot": True},
}


@dataclass
class CostRounds:
    """``autopilot_cost``'s measurements: each configuration's mean step time per round (the
    same rounds for every configuration, so they pair), and per round the agent thread's CPU
    time in the autopilot's looks over the round's wall time."""

    step_s: dict[str, list[float]]
    looks_share: list[float]


class LookClock:
    """The CPU time the agent thread spends in ``Autopilot.on_metrics`` (its looks), summed
    while installed."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __enter__(self) -> LookClock:
        from bsmon.probes.batch.autopilot import Autopilot

        self._original = original = Autopilot.on_metrics
        clock = self

        def timed(autopilot: Any, metrics: Any) -> None:
            began = time.thread_time()
            try:
                original(autopilot, metrics)
            finally:
                clock.seconds += time.thread_time() - began

        Autopilot.on_metrics = timed  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        from bsmon.probes.batch.autopilot import Autopilot

        Autopilot.on_metrics = self._original  # type: ignore[method-assign]


class CostJob:
    """One configuration's training job: its own model, optimizer, monitor and batches."""

    def __init__(self, task: Task, size: int, config: dict[str, Any]) -> None:
        from bsmon.probes import attach

        torch.manual_seed(0)
        self.task = task
        self.model = task.model()
        self.optimizer = task.optimizer(self.model.parameters(), 1e-4)
        options = {"record": False, "serve": False, "max_batch_size": size}
        self.mon = attach(self.model, self.optimizer, batch_size=size, **options, **config)
        self._loader = self.mon.dataloader(task.data().train, shuffle=True, collate_fn=whole_batch)
        self._batches = iter(self._loader)

    def run(self, steps: int) -> float:
        """``steps`` training steps; their wall time."""
        started = time.perf_counter()
        for _ in range(steps):
            try:
                inputs, labels = next(self._batches)
            except StopIteration:
                self._batches = iter(self._loader)
                inputs, labels = next(self._batches)
            self.mon.log(loss=train_step(self.task, self.model, self.optimizer, inputs, labels))
        return time.perf_counter() - started


def autopilot_cost(
    task: Task,
    size: int,
    *,
    rounds: int = 12,
    turns: int = 10,
    block: int = 100,
    warmup: int = 1500,
) -> CostRounds:
    """The autopilot's own cost, its estimate (the noise scale on its budget) and its
    decisions together: the mean step time at a fixed ``size`` under bsmon with the noise
    scale off, with it on, and with it on and the autopilot steering (held at ``size`` by
    ``max_batch_size``, so every look decides to stay). The three jobs live in one process
    and take turns, ``block`` steps at a time in an order rotated every turn, so that the
    machine's drift (here ±20% between fresh jobs a few seconds apart) falls on the three
    alike; a round is ``turns`` turns, after ``warmup`` steps each (the noise scale's warm-up
    and the autopilot's fast-paced first looks are then over)."""
    names = list(COST_CONFIGS)
    result = CostRounds({name: [] for name in names}, [])
    with LookClock() as looks:
        jobs = {name: CostJob(task, size, COST_CONFIGS[name]) for name in names}
        try:
            for _ in range(warmup // block):
                for job in jobs.values():
                    job.run(block)
            for round_ in range(rounds):
                spent = dict.fromkeys(names, 0.0)
                looked, began = looks.seconds, time.perf_counter()
                for turn in range(turns):
                    shift = (round_ * turns + turn) % len(names)
                    for name in names[shift:] + names[:shift]:
                        spent[name] += jobs[name].run(block)
                result.looks_share.append((looks.seconds - looked) / (time.perf_counter() - began))
                for name in names:
                    result.step_s[name].append(spent[name] / (turns * block))
                shown = ", ".join(f"{result.step_s[n][-1] * 1e3:.3f}" for n in names)
                print(f"  [{task.name}] cost round {round_}: {shown} ms", file=sys.stderr)
        finally:
            for job in jobs.values():
                job.mon.close()
    return result
