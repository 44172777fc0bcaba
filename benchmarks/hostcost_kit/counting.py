"""The Python calls a configuration adds to a step on the training thread: cProfile on that
thread only, one profile per step, every category, less the same loop without bsmon
(benchmarks/hostcost.py's counts; tests/unit/test_hot_path.py pins them)."""

from __future__ import annotations

import cProfile
import os
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from bsmon.probes.anatomy.sampling import STRIDE_VARIABLE

from .setups import Loop, Setup, Step, bare, make_loop

ROOT = Path(__file__).resolve().parents[2]
BSMON_DIRS = (str(ROOT / "probes"), str(ROOT / "tui"))
TORCH_DIR = str(Path(torch.__file__).parent)
STDLIB_DIR = os.path.dirname(os.__file__)


def category(code: object) -> str:
    if isinstance(code, str):
        return "C"  # a builtin: cProfile names it by a string
    filename = getattr(code, "co_filename", "")
    if filename.startswith(BSMON_DIRS):
        return "bsmon"
    if filename.startswith(TORCH_DIR):
        return "torch"
    if filename.startswith(STDLIB_DIR):
        return "stdlib"
    if filename.startswith("<"):
        return "generated"
    return "other"


def calls_of_one_step(step: Step) -> Counter[str]:
    """The Python calls one step makes on this thread, by category."""
    profile = cProfile.Profile()
    profile.enable()
    step()
    profile.disable()
    counts: Counter[str] = Counter()
    for entry in profile.getstats():
        counts[category(entry.code)] += entry.callcount
    return counts


@dataclass(frozen=True)
class CallCount:
    ordinary: int  # the most common step's added calls
    mean: float  # over all counted steps
    most: int  # the dearest counted step's added calls
    bsmon: int  # of the ordinary step's, bsmon's own functions
    by_category: dict[str, int]  # the ordinary step's, added per category


def settle(started: object, loop: Loop) -> None:
    """Let bsmon's agent (if ``started`` is one, or its monitor) see two ticks of steps and
    then take all of them: what it decides from them (the logging mode, a steady count of
    examples, the end of the noise scale's dense start) is what a step after the warm-up
    costs, whatever the tick's period and however slowly the warm-up ran; the logging mode
    is then held at a fast loop's."""
    from bsmon.probes.runtime.inbox import TICK_S

    monitor = getattr(started, "monitor", started)
    flush = getattr(monitor, "flush", None)
    if flush is None:
        return
    until = time.monotonic() + 2 * TICK_S
    while not loop.all_done(time.monotonic() >= until):  # ranks in step: the same steps
        loop.step()
    flush()
    # the mode of a fast loop (a host-bound GPU step's), held: the steps counted next run
    # under cProfile, several times slower, and on a loaded machine even the warm-up may run
    # under 320 steps a second; in the mode that keeps every loss, about half the steps then
    # drop the tensors the agent hands back, and the most common count flips with the load
    monitor.job.telemetry.logged_intake.hold_mode(latest_only=True)
    # the losses kept before that mode (the first SAMPLE_ABOVE steps') come back to the training
    # thread at a tick, to be dropped one a step: on a loaded machine the tick that reads them
    # can come late in the settling, and the steps counted next then each drop one (the full
    # path's 2 calls more: the most common count read 6, not 4)
    hot = monitor._hot
    while not loop.all_done(not hot._handed_back):
        loop.step()


def count_calls(
    setup: Setup, model_name: str = "tiny", steps: int = 300, warmup: int = 50
) -> CallCount:
    """Calls added per step against the bare loop (both counted the same way). The step
    anatomy samples at its base stride (one step in 4–12, drawn from a fixed seed): left to
    follow the step time, which cProfile and the machine's load stretch, its mean would
    depend on the machine."""

    def per_step(config: Setup) -> list[Counter[str]]:
        loop = make_loop(model_name)
        given = os.environ.get(STRIDE_VARIABLE)
        os.environ[STRIDE_VARIABLE] = "4-12"
        try:
            with config(loop) as started:
                for _ in range(warmup):
                    loop.step()
                settle(started, loop)
                return [calls_of_one_step(loop.step) for _ in range(steps)]
        finally:
            if given is None:
                del os.environ[STRIDE_VARIABLE]
            else:
                os.environ[STRIDE_VARIABLE] = given

    base = Counter(dict(statistics.mode(tuple(sorted(c.items())) for c in per_step(bare))))
    counted = per_step(setup)
    totals = [sum(c.values()) - sum(base.values()) for c in counted]
    ordinary = statistics.mode(totals)
    typical = next(c for c, t in zip(counted, totals, strict=True) if t == ordinary)
    added = {k: typical[k] - base[k] for k in sorted(set(typical) | set(base))}
    return CallCount(
        ordinary=ordinary,
        mean=statistics.fmean(totals),
        most=max(totals),
        bsmon=added.get("bsmon", 0),
        by_category={k: v for k, v in added.items() if v},
    )
