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
fresh attach, untimed warm-up steps, then timed steps, each step timed on its own. A bare
block is timed before a round's first configuration and after each one, and a block counts
as itself less the mean of its two bare neighbours: this machine's step drifts by ±10 µs
over seconds, far more than the costs measured, and a drift linear over the three cancels.
Two measures a block: the *ordinary step* (its median step: what every step pays; its
rounds spread by ~1 µs here, IQR) and *every step* (its mean, each step counted at most ``CLIP``
times the median: the sampled and measured steps count, a step this machine stretched by
milliseconds does not swamp the block; its rounds spread by 3–8 µs). Both add the CPU time
of the threads the configuration started, per step: bsmon's agent thread shares the GIL
with the training thread, so its work lands on the step (counted in full: an upper bound,
since the part spent in C with the GIL let go overlaps the step). bare's own row, bare less
bare, is the method's noise. A goal's verdict (issue 22: telemetry ≤ 2×, + record ≤ 3× a
floor) comes from a bootstrap interval of the ratio of medians over rounds: met or not met
when the whole interval says so, else not told apart on this machine. Two floors: issue 22's
(a post-hook with a clock and an append), and the same with the loop's logging line keeping
the loss (``latest.update(loss=loss)``), since every other row logs the loss and the log line
alone costs more in situ than the post-hook does.
Printed, never asserted: the counts are pinned in ``tests/unit/test_hot_path.py``.

    python benchmarks/hostcost.py                      # counts and times, tiny model
    python benchmarks/hostcost.py --model mid --rounds 15
    python benchmarks/hostcost.py --only floor telemetry "+ record" --rounds 40  # the goals
    python benchmarks/hostcost.py --counts-only
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import math
import operator
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import astuple, dataclass
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


@contextlib.contextmanager
def floor_with_loss(loop: Loop) -> Iterator[None]:
    """The floor, and the loop's logging line keeping a reference to the loss as the least a
    monitor that shows the loss must (``latest.update(loss=loss)``: what ``mon.log(loss=loss)``
    is on a fast loop, without bsmon)."""
    with floor(loop):
        latest: dict[str, torch.Tensor] = {}
        loop.log = lambda loss: latest.update(loss=loss)
        yield
        loop.log = None


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
        from bsmon.probes.runtime.audience import ENV_RESIZABLE

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
    "floor + loss kept: latest.update(loss=loss)": floor_with_loss,
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
CLIP = 2.0  # a timed step counts at most this many times its block's median
BRACKET_WARMUP = 200  # untimed bare steps after a configuration is taken down


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
    costs, whatever the tick's period and however slowly the warm-up ran; the logging mode
    is then held at a fast loop's."""
    from bsmon.probes.runtime.inbox import TICK_S

    monitor = getattr(started, "monitor", started)
    flush = getattr(monitor, "flush", None)
    if flush is None:
        return
    until = time.monotonic() + 2 * TICK_S
    while time.monotonic() < until:
        loop.step()
    flush()
    # the mode of a fast loop (a host-bound GPU step's), held: the steps counted next run
    # under cProfile, several times slower, and on a loaded machine even the warm-up may run
    # under 320 steps a second; in the mode that keeps every loss, about half the steps then
    # drop the tensors the agent hands back, and the most common count flips with the load
    monitor.job.telemetry.logged_intake.hold_mode(latest_only=True)


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
    names: list[str], model_name: str, rounds: int, steps: int
) -> dict[str, list[Block]]:
    """Each configuration's blocks less bare's around it, one per round, the order rotated.

    A bare block is timed before the first configuration of a round and after each one, so
    every configuration's block has bare on both sides, a second or so away: this machine's
    step time drifts by ±10 µs over seconds (another tenant, the clock), and the difference
    from the mean of its two neighbours cancels a drift that is linear over the three. Every
    block runs on the same model, optimizer and tensors: a fresh model per block moves the
    step time by more than the costs measured here (where its tensors land in memory)."""
    loop = make_loop(model_name)
    for _ in range(SETTLED):
        loop.step()
    added: dict[str, list[Block]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        before = time_block(bare, loop, steps, BRACKET_WARMUP)
        for name in order:
            block = time_block(CONFIGS[name], loop, steps, WARMUP.get(name, 200))
            after = time_block(bare, loop, steps, BRACKET_WARMUP)
            added[name].append(block.less((before, after)))
            before = after
    return added


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, median, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return q1, median, q3


GOALS = (  # issue 22: (configuration, the most it may cost, in floors)
    ("telemetry (noise, anatomy, record off)", 2),
    ("+ record", 3),  # the defaults without the noise scale's own measured-step budget
)
FLOORS = (
    "floor: perf_counter + append in a post-hook",  # issue 22's
    "floor + loss kept: latest.update(loss=loss)",  # what every row but bare logs
)
RESAMPLES = 4000


def ratio_interval(
    costs: list[float], floors: list[float], rng: random.Random
) -> tuple[float, float, float]:
    """The ratio of the medians of two lists of per-round costs, with a 90% bootstrap
    interval (rounds drawn again with replacement, the same rounds for both: a round's
    configuration and floor share its minutes)."""
    pairs = list(zip(costs, floors, strict=True))
    ratios = []
    for _ in range(RESAMPLES):
        drawn = rng.choices(pairs, k=len(pairs))
        floor_median = statistics.median(f for _, f in drawn)
        if floor_median > 0:
            ratios.append(statistics.median(c for c, _ in drawn) / floor_median)
    ratios.sort()
    if len(ratios) < RESAMPLES // 2:  # the floor itself is not told apart from nothing
        return math.nan, math.nan, math.nan
    low, high = ratios[len(ratios) // 20], ratios[len(ratios) * 19 // 20]
    return statistics.median(costs) / statistics.median(floors), low, high


def spread(values: list[float]) -> str:
    q1, median, q3 = quartiles(values)
    return f"{median:+6.1f} [{q1:+.1f}, {q3:+.1f}]"


def print_goals(measures: dict[str, dict[str, list[float]]]) -> None:
    """Each goal's verdict against each floor, by each measure: met when the bootstrap
    interval of the ratio lies at or under it, not met when over it, otherwise not told
    apart on this machine."""
    rng = random.Random(22)
    for floor_name in FLOORS:
        if floor_name not in measures["ordinary step"]:
            continue
        print(f"\nagainst {floor_name}:")
        for name, most in GOALS:
            for measure, added_us in measures.items():
                if name not in added_us:
                    continue
                ratio, low, high = ratio_interval(added_us[name], added_us[floor_name], rng)
                if math.isnan(ratio):
                    verdict = "no verdict: the floor is not told apart from bare"
                elif high <= most:
                    verdict = "met"
                elif low > most:
                    verdict = "not met"
                else:
                    verdict = "not told apart from the goal; run more rounds"
                print(
                    f"  {name}, {measure}: {ratio:.1f}× [{low:.1f}, {high:.1f}] "
                    f"(goal ≤ {most}×): {verdict}"
                )


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

    print(f"\nµs added per step, {args.rounds} rounds × {args.steps} steps on one model. Each")
    print("block's steps are timed one by one; a block less the mean of the bare blocks timed")
    print("just before and after it. ordinary: the median step; every step: the mean, each step")
    print(f"counted at most {CLIP:g}× the median (a step this machine stretched moves a block by")
    print("little); both + the CPU time of the threads the configuration started (bsmon's agent:")
    print("the GIL puts it on the training thread). Medians [IQR] over rounds; bare's own row is")
    print("the method's noise. threads and CPU (the training thread's): medians, µs a step\n")
    print(
        f"{'configuration':46} {'ordinary step':>21} {'every step':>21} {'threads':>7} {'CPU':>6}"
    )
    added = time_configs(names, args.model, args.rounds, args.steps)
    ordinary_us: dict[str, list[float]] = {}
    every_us: dict[str, list[float]] = {}
    for name in names:
        blocks = added[name]
        ordinary_us[name] = [(b.ordinary + b.others) * 1e6 for b in blocks]
        every_us[name] = [(b.wall + b.others) * 1e6 for b in blocks]
        others = statistics.median(b.others * 1e6 for b in blocks)
        cpu = statistics.median(b.cpu * 1e6 for b in blocks)
        print(
            f"{name:46} {spread(ordinary_us[name]):>21} {spread(every_us[name]):>21} "
            f"{others:7.1f} {cpu:+6.1f}"
        )
    print_goals({"ordinary step": ordinary_us, "every step": every_us})
    print(f"\nload average {os.getloadavg()[0]:.1f}; python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
