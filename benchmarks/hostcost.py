"""What bsmon costs the training thread per step: Python calls (counted, deterministic) and
microseconds (timed side by side), on steps small enough to be all fixed host overhead.

On a GPU a small or medium model's step is host-bound, so every Python call bsmon makes on
the training thread is added to the step. The same cost shows on a CPU with a step that is
mostly PyTorch's own fixed overhead: ``tiny`` is ``nn.Linear(16, 16)`` at batch 4 (~160 µs
here), ``mid`` an MLP 256-512-512-10 at batch 16 (~0.9 ms).

Counts: cProfile on the training thread only (CPython's profiler is per thread), one profile
per step, every category — bsmon's own functions and the builtins, torch and stdlib calls
they cause — minus the same loop without bsmon. An *ordinary* step is the most common count
(a step the noise scale does not measure and the anatomy does not sample); the mean includes
the measured and sampled ones.

Times: rounds of blocks, one block per configuration in an order rotated every round, all on
one model (a fresh model per block moves the step by more than these costs), each block a
fresh attach, untimed warm-up steps, then timed steps. The headline is the best round's
block less bare's best (timeit's rule: this machine's noise only ever adds time), beside the
median over rounds of (configuration − bare) with its interquartile range, the training
thread's CPU time, and the CPU time of the threads the configuration started: bsmon's agent
thread shares the GIL with the training thread, so its time per step lands on the step too.
Printed, never asserted: the counts are pinned in ``tests/unit/test_hot_path.py``.

    python benchmarks/hostcost.py                      # counts and times, tiny model
    python benchmarks/hostcost.py --model mid --rounds 15
    python benchmarks/hostcost.py --counts-only
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bsmon.probes.anatomy.sampling import STRIDE_VARIABLE

ROOT = Path(__file__).resolve().parent.parent
BSMON_DIRS = (str(ROOT / "probes"), str(ROOT / "tui"))
TORCH_DIR = str(Path(torch.__file__).parent)
STDLIB_DIR = os.path.dirname(os.__file__)

Step = Callable[[], None]


@dataclass
class Loop:
    """One training step of a model, with an optional logging call after it."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    x: torch.Tensor
    y: torch.Tensor
    log: Callable[[torch.Tensor], None] | None = None
    batches: Iterator | None = None  # a DataLoader's, drawn each step (else x and y again)

    def step(self) -> None:
        if self.batches is not None:
            self.x, self.y = next(self.batches)
        loss = nn.functional.mse_loss(self.model(self.x), self.y)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.log is not None:
            self.log(loss)


MODELS = ("tiny", "mid", "tiny-loader", "tiny-bn")


def endless(loader: DataLoader) -> Iterator:
    while True:
        yield from loader


def make_loop(model_name: str) -> Loop:
    """``tiny``, ``mid``, ``tiny-loader``: the tiny step drawing its batch from a DataLoader
    (the per-batch hook's cost), or ``tiny-bn``: the tiny step through a BatchNorm (the noise
    scale waits for gradient accumulation there)."""
    torch.manual_seed(0)
    if model_name == "tiny-bn":
        model: nn.Module = nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16))
        x, y = torch.randn(4, 16), torch.randn(4, 16)
    elif model_name.startswith("tiny"):
        model = nn.Linear(16, 16)
        x, y = torch.randn(4, 16), torch.randn(4, 16)
    else:
        model = nn.Sequential(
            nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
        )
        x, y = torch.randn(16, 256), torch.randn(16, 10)
    loop = Loop(model, torch.optim.SGD(model.parameters(), lr=1e-3), x, y)
    if model_name.endswith("loader"):
        data = TensorDataset(torch.randn(4096, 16), torch.randn(4096, 16))
        loop.batches = endless(DataLoader(data, batch_size=4))
    return loop


# -- configurations: each one sets a loop up and gives back how to take it down ---------------

Setup = Callable[[Loop], contextlib.AbstractContextManager]


@contextlib.contextmanager
def bare(_loop: Loop) -> Iterator[None]:
    yield


@contextlib.contextmanager
def floor(loop: Loop) -> Iterator[None]:
    """The least the same step record could cost: one post-hook, one clock, one append."""
    inbox: deque = deque(maxlen=4096)
    clock, append = time.perf_counter, inbox.append
    handle = loop.optimizer.register_step_post_hook(lambda *_: append(clock()))
    yield
    handle.remove()


def bsmon(**options: object) -> Setup:
    @contextlib.contextmanager
    def setup(loop: Loop) -> Iterator[object]:  # the monitor
        from bsmon.probes import attach

        with tempfile.TemporaryDirectory() as where:
            record = Path(where) / "run.jsonl" if options.get("record") else False
            settings = {"serve": False, **options, "record": record}
            with attach(loop.model, loop.optimizer, **settings) as mon:  # type: ignore[arg-type]
                loop.log = lambda loss: mon.log(loss=loss)
                yield mon
                loop.log = None

    return setup


def zero_code(resizable: bool = False) -> Setup:
    """What ``bsmon run`` (``--resizable``) loads into an unmodified script (in this process:
    the same agent, without the process boot)."""

    @contextlib.contextmanager
    def setup(loop: Loop) -> Iterator[object]:  # the agent: its monitor from the first step
        from bsmon.probes.launch.autoattach import AutoAttach
        from bsmon.probes.launch.environment import ENV_RESIZABLE

        os.environ[ENV_RESIZABLE] = "1" if resizable else "0"
        agent = AutoAttach("hostcost")
        del os.environ[ENV_RESIZABLE]
        agent.install()
        try:
            yield agent
        finally:
            agent.uninstall()

    return setup


@contextlib.contextmanager
def tensorboard(loop: Loop) -> Iterator[None]:
    from torch.utils.tensorboard import SummaryWriter

    with tempfile.TemporaryDirectory() as where:
        writer = SummaryWriter(where)
        steps = iter(range(10**9))
        loop.log = lambda loss: writer.add_scalar("loss", loss.item(), next(steps))
        yield
        loop.log = None
        writer.close()


@contextlib.contextmanager
def weights_and_biases(loop: Loop) -> Iterator[None]:
    import wandb

    with tempfile.TemporaryDirectory() as where:
        run = wandb.init(mode="offline", dir=where, project="hostcost")
        loop.log = lambda loss: run.log({"loss": loss.item()})
        yield
        loop.log = None
        run.finish()


NO_NOISE = {"noise_scale": None}
DECLARED = {"batch_size": 4}  # as the README's attach() does; bsmon run declares none
CONFIGS: dict[str, Setup] = {
    "bare": bare,
    "floor: perf_counter + append in a post-hook": floor,
    "telemetry (noise, anatomy, record off)": bsmon(**NO_NOISE, **DECLARED, step_anatomy=False),
    "+ step anatomy": bsmon(**NO_NOISE, **DECLARED),
    "+ record": bsmon(**NO_NOISE, **DECLARED, record=True),
    "defaults (noise scale on its budget)": bsmon(**DECLARED, record=True),
    "noise scale every step": bsmon(**DECLARED, record=True, noise_budget=None),
    "defaults, no batch size declared": bsmon(record=True),
    "bsmon run (zero-code)": zero_code(),
    "bsmon run --resizable": zero_code(resizable=True),
    "TensorBoard add_scalar(loss.item())": tensorboard,
    "W&B offline run.log(loss.item())": weights_and_biases,
}
# Untimed steps before each block's timed ones. bsmon's run until its agent has ticked a few
# times: from the first tick the step anatomy's stride follows the step rate (before it, one
# step in 4–12 is timed, as at the start of any job: on this step ~600 steps, which a 200-step
# warm-up left in the timed block), and the noise scale's dense warm-up (≤ 300 steps) is over.
SETTLED = 3000
OTHERS = ("bare", "floor", "TensorBoard", "W&B")
WARMUP = {name: SETTLED for name in CONFIGS if not name.startswith(OTHERS)}


def available(name: str) -> str | None:
    """Why a configuration cannot run here, or None."""
    package = {"TensorBoard": "tensorboard", "W&B": "wandb"}.get(name.split(maxsplit=1)[0])
    if package is not None:
        try:
            __import__(package)
        except ImportError:
            return f"{name}: left out, {package} is not installed (pip install {package})"
    return None


# -- counting ---------------------------------------------------------------------------------


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
    bsmon: int  # of the ordinary step's, bsmon's own functions
    by_category: dict[str, int]  # the ordinary step's, added per category


def settle(started: object, loop: Loop) -> None:
    """Let bsmon's agent (if ``started`` is one, or its monitor) see two ticks of steps and
    then take all of them: what it decides from them (the logging mode, a steady count of
    examples, the end of the noise scale's dense start) is what a step after the warm-up
    costs, whatever the tick's period and however slowly the warm-up ran."""
    from bsmon.probes.runtime.service import TICK_S

    monitor = getattr(started, "monitor", started)
    flush = getattr(monitor, "flush", None)
    if flush is None:
        return
    until = time.monotonic() + 2 * TICK_S
    while time.monotonic() < until:
        loop.step()
    flush()


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
        bsmon=added.get("bsmon", 0),
        by_category={k: v for k, v in added.items() if v},
    )


# -- timing -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """One timed block, seconds per step."""

    wall: float
    cpu: float  # the training thread's own CPU time
    others: float  # CPU time of the threads the configuration started (bsmon's agent...)


def _thread_cpu(threads: list[threading.Thread]) -> float:
    total = 0.0
    for thread in threads:
        with contextlib.suppress(OSError, TypeError):  # a thread that has ended
            total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))  # type: ignore[arg-type]
    return total


def time_block(setup: Setup, loop: Loop, steps: int, warmup: int) -> Block:
    """A configuration set up on ``loop``, warmed up, then timed."""
    before = set(threading.enumerate())
    with setup(loop):
        for _ in range(warmup):
            loop.step()
        started = [t for t in threading.enumerate() if t not in before]
        began, began_cpu, began_others = (
            time.perf_counter(),
            time.thread_time(),
            _thread_cpu(started),
        )
        for _ in range(steps):
            loop.step()
        wall, cpu = time.perf_counter() - began, time.thread_time() - began_cpu
        others = _thread_cpu(started) - began_others
        return Block(wall / steps, cpu / steps, others / steps)


def time_configs(
    names: list[str], model_name: str, rounds: int, steps: int
) -> dict[str, list[Block]]:
    """Each configuration's blocks, one per round, the order rotated. Every block runs on the
    same model, optimizer and tensors: a fresh model per block moves the step time by more
    than the costs measured here (where its tensors land in memory)."""
    loop = make_loop(model_name)
    blocks: dict[str, list[Block]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            warmup = WARMUP.get(name, 200)
            blocks[name].append(time_block(CONFIGS[name], loop, steps, warmup))
    return blocks


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, median, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return q1, median, q3


GOALS = (  # issue 22: (configuration, the most it may cost, in floors)
    ("telemetry (noise, anatomy, record off)", 2),
    ("+ record", 3),  # the defaults without the noise scale's own measured-step budget
)


def print_goals(best: dict[str, float], spread_us: float) -> None:
    """The goals' verdicts, unless the machine's noise (``spread_us``: the interquartile
    range of bare's own blocks, µs a step) is larger than the floor it would judge by."""
    floor_us = best.get("floor: perf_counter + append in a post-hook")
    if floor_us is None or floor_us <= 0:
        return
    print(f"\nagainst the floor ({floor_us:.1f} µs, best round):")
    if spread_us > floor_us:
        print(
            f"  no verdict: bare's own blocks spread {spread_us:.1f} µs a step between rounds "
            "(IQR), more than the floor costs; run again on a quieter machine"
        )
        return
    for name, most in GOALS:
        if name in best:
            ratio = best[name] / floor_us
            verdict = "met" if ratio <= most else "not met"
            print(f"  {name}: {ratio:.1f}× the floor (goal ≤ {most}×): {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=MODELS, default="tiny")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=2000, help="timed steps per block")
    parser.add_argument("--counts-only", action="store_true")
    parser.add_argument(
        "--only", nargs="+", metavar="WORD", help="the configurations whose names have a WORD"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    names = [name for name in CONFIGS if (why := available(name)) is None or print(why)]
    if args.only:
        names = [n for n in names if n == "bare" or any(w in n for w in args.only)]

    print(f"\nPython calls added per step on the training thread ({args.model} model)\n")
    print(f"{'configuration':46} {'ordinary':>8} {'mean':>7} {'bsmon':>6}  by category")
    for name in names[1:]:
        count = count_calls(CONFIGS[name], args.model, warmup=WARMUP.get(name, 50))
        parts = ", ".join(f"{k} {v:+d}" for k, v in count.by_category.items())
        print(f"{name:46} {count.ordinary:>+8d} {count.mean:>+7.1f} {count.bsmon:>+6d}  {parts}")
    if args.counts_only:
        return

    print(f"\nµs added per step, {args.rounds} rounds × {args.steps} steps on one model. best:")
    print("the quickest round's block less bare's (the machine's noise only ever adds); then")
    print("the median [IQR] of the rounds' differences; the training thread's CPU time; the CPU")
    print("time of the threads the configuration started (bsmon's agent), per step\n")
    blocks = time_configs(names, args.model, args.rounds, args.steps)
    bare_best = min(b.wall for b in blocks["bare"])
    bare_q1, _, bare_q3 = quartiles([b.wall * 1e6 for b in blocks["bare"]])
    print(
        f"{'bare':46} {bare_best * 1e6:7.1f} µs/step (best round), "
        f"rounds' IQR {bare_q3 - bare_q1:.1f}"
    )
    best: dict[str, float] = {}
    for name in names[1:]:
        pairs = list(zip(blocks[name], blocks["bare"], strict=True))
        best[name] = (min(b.wall for b in blocks[name]) - bare_best) * 1e6
        wall = quartiles([(c.wall - b.wall) * 1e6 for c, b in pairs])
        cpu = statistics.median((c.cpu - b.cpu) * 1e6 for c, b in pairs)
        others = statistics.median(c.others * 1e6 for c in blocks[name])
        print(
            f"{name:46} best {best[name]:+6.1f}   median {wall[1]:+6.1f} [{wall[0]:+.1f}, "
            f"{wall[2]:+.1f}]   CPU {cpu:+5.1f}   threads {others:4.1f}"
        )
    print_goals(best, bare_q3 - bare_q1)
    print(f"\nload average {os.getloadavg()[0]:.1f}; python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
