"""Timed blocks of steps, run in rotated order round by round, and what they read as: the
median per step and the median of the paired per-round ratios (benchmarks/overhead.py)."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator

from .models import Step

Sample = tuple[float, float, float]


@contextlib.contextmanager
def only(mon: object | None, monitors: list[object]) -> Iterator[None]:
    """Every monitor's forward watch but ``mon``'s suspended while inside: a global forward
    hook registered for one copy's next measured step would otherwise slow the other copies'
    steps too."""
    with contextlib.ExitStack() as stack:
        for other in monitors:
            if other is not mon:
                stack.enter_context(other._watch.suspended())  # type: ignore[attr-defined]
        yield


def time_block(
    step: Step, steps: int, mon: object | None, sync: Callable[[], None] | None = None
) -> Sample:
    """Per step: wall time, process CPU time, and the training thread's own CPU time.

    On a GPU pass ``sync`` (``torch.cuda.synchronize``): it runs before the clock starts and
    before it stops, so a block counts the device's work, not only the host's queueing; the
    steps inside the block never wait for the device."""
    if sync is not None:
        sync()
    wall, cpu, thread = time.perf_counter(), time.process_time(), time.thread_time()
    for _ in range(steps):
        step(mon)
    if sync is not None:
        sync()
    return (
        (time.perf_counter() - wall) / steps,
        (time.process_time() - cpu) / steps,
        (time.thread_time() - thread) / steps,
    )


def rotations(names: list[str], round_: int) -> list[str]:
    """Round r: the names rotated by r, reversed every other pass (each position equally)."""
    shift = round_ % len(names)
    order = names[shift:] + names[:shift]
    return order[::-1] if (round_ // len(names)) % 2 else order


Times = dict[str, list[Sample]]
Block = Callable[[], Sample]


def interleave(blocks: dict[str, Block], rounds: int) -> Times:
    """Run every block once per round, in the rotated order of ``rotations``."""
    times: Times = {v: [] for v in blocks}
    for round_ in range(rounds):
        for variant in rotations(list(blocks), round_):
            times[variant].append(blocks[variant]())
    return times


def ratio(values: list[float], base: list[float]) -> str:
    """Median of the paired ratios, with their interquartile range."""
    ratios = [v / b for v, b in zip(values, base, strict=True)]
    if len(ratios) < 4:
        return f"{statistics.median(ratios):.3f}"
    q1, q2, q3 = statistics.quantiles(ratios, n=4)
    return f"{q2:.3f} [{q1:.3f}-{q3:.3f}]"


def summary(times: Times, base: str, k: int = 0) -> dict[str, tuple[float, float, str]]:
    """Per variant, for measure ``k`` (0 wall, 1 process CPU, 2 training-thread CPU): the
    median per step in seconds, the ratio of medians to ``base``, and ``ratio()``'s text."""
    base_values = [b[k] for b in times[base]]
    base_median = statistics.median(base_values)
    out = {}
    for variant, values in times.items():
        mine = [v[k] for v in values]
        median = statistics.median(mine)
        out[variant] = (median, median / base_median, ratio(mine, base_values))
    return out


def table(times: Times, base: str) -> list[str]:
    heads = ("wall", "process CPU", "training-thread CPU")
    lines = ["  " + " " * 18 + "".join(f"{h:>31}" for h in heads)]
    lines.append("  " + f"{'variant':<18}" + f"{'ms':>8}{'ratio, IQR':>23}" * 3)
    summaries = [summary(times, base, k) for k in range(3)]
    for variant in times:
        cells = [f"{s[variant][0] * 1e3:>8.2f}{s[variant][2]:>23}" for s in summaries]
        lines.append(f"  {variant:<18}" + "".join(cells))
    return lines
