"""The microseconds a configuration adds to a step (benchmarks/hostcost.py's times): blocks
timed step by step, each less the bare blocks timed either side of it, in rounds."""

from __future__ import annotations

import contextlib
import operator
import threading
import time
from dataclasses import astuple, dataclass

from .setups import CONFIGS, SETTLED, WARMUP, Loop, Setup, bare, make_loop

CLIP = 2.0  # a timed step counts at most this many times its block's median
BRACKET_WARMUP = 200  # untimed bare steps after a configuration is taken down


@dataclass(frozen=True)
class Block:
    """One timed block, seconds per step."""

    wall: float  # every step's, each counted at most CLIP times the median
    ordinary: float  # the median step's
    cpu: float  # the training thread's own CPU time
    others: float  # CPU time of the threads the configuration started (bsmon's agent...)

    def less(self, around: tuple[Block, Block]) -> Block:
        """This block less the mean of two others (bare's, timed either side of it)."""
        first, second = around
        return Block(
            *(
                mine - (theirs + also) / 2
                for mine, theirs, also in zip(
                    astuple(self), astuple(first), astuple(second), strict=True
                )
            )
        )


def _thread_cpu(threads: list[threading.Thread]) -> float:
    total = 0.0
    for thread in threads:
        with contextlib.suppress(OSError, TypeError):  # a thread that has ended
            total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))  # type: ignore[arg-type]
    return total


def time_block(setup: Setup, loop: Loop, steps: int, warmup: int) -> Block:
    """A configuration set up on ``loop``, warmed up, then timed step by step: the median
    step (an ordinary one: what every step pays), and the mean step with each counted at
    most ``CLIP`` times the median (a step stretched by this machine, up to tens of ms, then
    moves a block by a bounded amount, while a step bsmon lengthens, a sampled or measured
    one, still counts). The GIL's stall for an agent's tick is clipped with the rest, and is
    counted instead as the agent thread's CPU (``others``)."""
    before = set(threading.enumerate())
    stamps = [0.0] * (steps + 1)
    step, clock = loop.step, time.perf_counter
    with setup(loop):
        for _ in range(warmup):
            step()
        started = [t for t in threading.enumerate() if t not in before]
        began_cpu, began_others = time.thread_time(), _thread_cpu(started)
        for i in range(steps):
            stamps[i] = clock()
            step()
        stamps[steps] = clock()
        cpu = time.thread_time() - began_cpu
        others = _thread_cpu(started) - began_others
    durations = sorted(map(operator.sub, stamps[1:], stamps[:-1]))
    median = durations[len(durations) // 2]
    clipped = sum(min(d, CLIP * median) for d in durations)
    return Block(clipped / steps, median, cpu / steps, others / steps)


def time_configs(
    names: list[str], model_name: str, rounds: int, steps: int, settled: int = SETTLED
) -> dict[str, list[Block]]:
    """Each configuration's blocks less bare's around it, one per round, the order rotated.

    A bare block is timed before the first configuration of a round and after each one, so
    every configuration's block has bare on both sides, a second or so away: this machine's
    step time drifts by ±10 µs over seconds (another tenant, the clock), and the difference
    from the mean of its two neighbours cancels a drift that is linear over the three. Every
    block runs on the same model, optimizer and tensors: a fresh model per block moves the
    step time by more than the costs measured here (where its tensors land in memory).
    ``settled``: the warm-up of the model, and of each bsmon block (fewer for a slower step:
    a few of the agent's ticks)."""
    loop = make_loop(model_name)
    for _ in range(settled):
        loop.step()
    added: dict[str, list[Block]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        before = time_block(bare, loop, steps, BRACKET_WARMUP)
        for name in order:
            warmup = settled if name in WARMUP else BRACKET_WARMUP
            block = time_block(CONFIGS[name], loop, steps, warmup)
            after = time_block(bare, loop, steps, BRACKET_WARMUP)
            added[name].append(block.less((before, after)))
            before = after
    return added
