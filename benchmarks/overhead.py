"""Step-time overhead of the bsmon agent and of its noise-scale estimator on CPU training
loops, measured side by side in one process.

Part 1, the agent: blocks of training steps alternate between ``off`` (no agent), ``agent``
(attached and serving, a monitor process connected and reading every message, the noise
scale turned off) and ``agent, no anatomy`` (the same without the step anatomy: what timing
each step's phases costs), the order rotated every round. Each block attaches afresh and runs
untimed warm-up steps first.

Part 2, the noise scale: three identical copies of the model each train with their own
monitor attached for the whole run — ``agent`` (noise scale off), ``noise`` (the defaults,
timed once the dense warm-up is over and the estimate is tracking under the cost budget) and
``noise-every-step`` (``noise_budget=None``: what the per-example norms themselves cost, and
what the warm-up costs) — and a fourth, ``floor``: the agent alone plus the least machinery
that computes the same per-example norms every step (``pernorm_floor.py``), the floor that
every-step measuring is compared with — in short interleaved blocks, so load from other
processes on a shared machine falls on all four alike. While one copy's block runs, the
others' forward watches are suspended: a global forward hook registered for one copy's next
measured step would otherwise slow the other copies' steps too.

Part 3, what a user would pick instead (``--compare``): the same loop logging its loss every
step to Weights & Biases (offline), to TensorBoard's ``SummaryWriter.add_scalar``, to bsmon
with the noise scale off (telemetry), and to bsmon at its defaults (tracking), against the
bare loop. W&B and TensorBoard take the loss as a Python float (``loss.item()``), as their
users write it; ``mon.log`` takes the tensor and never synchronises a device.

A variant's figure is the median over blocks; a ratio is the median of per-round ratios
(paired), with their interquartile range. Wall-clock, process CPU and training-thread CPU
time are reported; on a shared machine the training thread's CPU time at one thread
(``--threads 1``) is the steadiest, and for the noise scale, whose work is all on that thread,
the most telling. The noise scale's total overhead is about the agent's ratio times the noise
ratio. Goals: agent <= 1.01; the anatomy <= 1.01 against the agent without it; the noise
scale at its defaults, once tracking, <= 1.01 on the MLP and <= 1.02 on the CNN and the
transformer; every-step measuring within 1.03x of the floor. Figures are printed, never
asserted.

    python benchmarks/overhead.py                    # MLP, CNN and transformer block
    python benchmarks/overhead.py --model mlp --rounds 40 --threads 1
    python benchmarks/overhead.py --model mlp --compare   # + W&B and TensorBoard
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from pernorm_floor import FloorHooks
from torch import nn

READER = """
import os, sys, time
from bsmon.probes.wire.client import JobConnection
path, received, parent = sys.argv[1], 0, os.getppid()
while os.getppid() == parent:  # a benchmark killed by a timeout must not leave this behind
    try:
        with JobConnection(path, timeout=1.0) as conn:
            while not conn.eof and os.getppid() == parent:
                received += len(conn.pump(0.5))
    except (ConnectionError, OSError):
        time.sleep(0.01)
"""

NO_ANATOMY = "agent, no anatomy"
AGENT_VARIANTS = {
    "off": None,
    NO_ANATOMY: {"noise_scale": None, "step_anatomy": False},
    "agent": {"noise_scale": None},
}
NOISE_VARIANTS = {
    "agent": {"noise_scale": None},
    "noise": {},
    "noise-every-step": {"noise_budget": None},
}

FLOOR = "floor"

Step = Callable[[object | None], torch.Tensor | None]


def mlp(batch: int) -> tuple[nn.Module, tuple[torch.Tensor, ...], nn.Module, int]:
    model = nn.Sequential(
        nn.Linear(256, 640), nn.ReLU(), nn.Linear(640, 640), nn.ReLU(), nn.Linear(640, 10)
    )
    return model, (torch.randn(batch, 256),), nn.CrossEntropyLoss(), batch


def cnn(batch: int) -> tuple[nn.Module, tuple[torch.Tensor, ...], nn.Module, int]:
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1, stride=2),
        nn.GroupNorm(8, 64),
        nn.ReLU(),
        nn.Conv2d(64, 128, 3, padding=1, stride=2),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, 10),
    )
    return model, (torch.randn(batch, 3, 32, 32),), nn.CrossEntropyLoss(), batch


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 1000, width: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.block = nn.TransformerEncoderLayer(
            width, nhead=4, dim_feedforward=4 * width, dropout=0.0, batch_first=True
        )
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.embed(tokens))).flatten(0, 1)


def transformer(batch: int) -> tuple[nn.Module, tuple[torch.Tensor, ...], nn.Module, int]:
    model = TinyTransformer()
    tokens = torch.randint(0, 1000, (batch, 64))
    return model, (tokens,), nn.CrossEntropyLoss(), batch


MODELS = {
    "mlp": (mlp, 256, "MLP 256-640-640-10, batch {batch}"),
    "cnn": (cnn, 64, "CNN 3 conv + GroupNorm on 3x32x32, batch {batch}"),
    "transformer": (
        transformer,
        16,
        "Embedding + TransformerEncoderLayer(128, 4 heads) + head, batch {batch} x 64 tokens",
    ),
}


def make_step(
    name: str, device: torch.device | str = "cpu", batch: int | None = None
) -> tuple[nn.Module, torch.optim.Optimizer, Step, int, str]:
    """A model, its optimizer and one training step on ``device`` (the default batch unless
    ``batch`` is given); returns (model, optimizer, step, examples per step, label)."""
    build, default_batch, label = MODELS[name]
    batch = batch or default_batch
    torch.manual_seed(0)
    model, inputs, loss_fn, examples = build(batch)
    model = model.to(device)
    inputs = tuple(t.to(device) for t in inputs)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with torch.no_grad():
        out = model(*inputs)
    target = torch.randint(0, out.shape[-1], (out.shape[0],), device=device)

    def step(mon: object | None = None) -> torch.Tensor:
        loss = loss_fn(model(*inputs), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if mon is not None:
            mon.log(loss=loss)  # type: ignore[attr-defined]
        return loss

    return model, optimizer, step, examples, label.format(batch=batch)


Sample = tuple[float, float, float]


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


def agent_blocks(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    step: Step,
    batch: int,
    args: argparse.Namespace,
    sync: Callable[[], None] | None = None,
) -> dict[str, Block]:
    """One block per variant of ``AGENT_VARIANTS``: ``off`` times the bare steps; the others
    attach afresh, warm up, time ``args.agent_steps`` steps and close."""
    from bsmon.probes import attach

    def block(options: dict | None) -> Block:
        def run() -> Sample:
            if options is None:
                return time_block(step, args.agent_steps, None, sync)
            mon = attach(model, optimizer, batch_size=batch, name="bench-agent", **options)
            try:
                for _ in range(args.warmup):
                    step(mon)
                return time_block(step, args.agent_steps, mon, sync)
            finally:
                mon.close()

        return run

    return {variant: block(options) for variant, options in AGENT_VARIANTS.items()}


def bench_agent(
    name: str,
    args: argparse.Namespace,
    device: torch.device | str = "cpu",
    batch: int | None = None,
    sync: Callable[[], None] | None = None,
) -> Times:
    model, optimizer, step, examples, _ = make_step(name, device, batch)
    for _ in range(args.warmup):
        step(None)
    blocks = agent_blocks(model, optimizer, step, examples, args, sync)
    return interleave(blocks, args.agent_rounds)


WARMUP_CAP = 600  # steps: the dense warm-up ends within 300 at the defaults


def warm_up(step: Step, mon: object) -> int:
    """Steps until the monitor's noise scale tracks under its budget (the end of the dense
    warm-up); returns how many it took (WARMUP_CAP: it did not end)."""
    noise = mon._noise  # type: ignore[attr-defined]
    for steps in range(1, WARMUP_CAP + 1):
        step(mon)
        if noise.source is None or noise.phase != "warming up":
            return steps
    return WARMUP_CAP


@contextlib.contextmanager
def only(mon: object | None, monitors: list[object]) -> Iterator[None]:
    """Every monitor's forward watch but ``mon``'s suspended while inside."""
    with contextlib.ExitStack() as stack:
        for other in monitors:
            if other is not mon:
                stack.enter_context(other._watch.suspended())  # type: ignore[attr-defined]
        yield


def warm_all(
    copies: dict[str, tuple[Step, object | None]],
    monitors: list[object],
    args: argparse.Namespace,
    defaults: str,
) -> int:
    """Untimed steps for every copy, each alone; the ``defaults`` copy first until its noise
    scale tracks. Returns how many steps that warm-up took."""
    warmed = 0
    for variant, (step, mon) in copies.items():
        with only(mon, monitors):
            if variant == defaults:
                warmed = warm_up(step, mon)
            for _ in range(args.warmup):
                step(mon)
    return warmed


def alone(
    step: Step,
    mon: object | None,
    monitors: list[object],
    steps: int,
    sync: Callable[[], None] | None = None,
) -> Sample:
    """A timed block of one copy, with every other copy's forward watch suspended."""
    with only(mon, monitors):
        return time_block(step, steps, mon, sync)


def bench_noise(
    name: str,
    args: argparse.Namespace,
    device: torch.device | str = "cpu",
    batch: int | None = None,
    sync: Callable[[], None] | None = None,
) -> tuple[Times, float]:
    """Three copies of the model, one monitor each (``NOISE_VARIANTS``), in interleaved
    blocks, the defaults timed once tracking; returns the times and the share of steps the
    default budget measured."""
    from bsmon.probes import attach

    copies = {}
    for variant, options in NOISE_VARIANTS.items():
        model, optimizer, step, examples, _ = make_step(name, device, batch)
        mon = attach(
            model, optimizer, batch_size=examples, name=f"bench-{variant}", serve=False, **options
        )
        copies[variant] = (step, mon)
    model, optimizer, step, examples, _ = make_step(name, device, batch)
    floor_mon = attach(
        model, optimizer, batch_size=examples, name="bench-floor", serve=False, noise_scale=None
    )
    floor = FloorHooks(model, optimizer)
    copies[FLOOR] = (step, floor_mon)
    monitors = [mon for _, mon in copies.values()]
    args.warmed_up = warm_all(copies, monitors, args, "noise")

    def block(step: Step, mon: object) -> Block:
        return lambda: alone(step, mon, monitors, args.block, sync)

    times = interleave({v: block(*copy) for v, copy in copies.items()}, args.rounds)
    share = copies["noise"][1]._noise.budget.share  # type: ignore[attr-defined]
    floor.close()
    for mon in monitors:
        mon.close()  # type: ignore[attr-defined]
    return times, share


def logger_step(step: Step, log: Callable[[float, int], None]) -> Step:
    """``step`` with its loss logged as a Python float, the way W&B and TensorBoard take it."""
    counter = iter(range(1 << 62))

    def logged(_mon: object | None) -> None:
        loss = step(None)
        log(loss.item(), next(counter))  # type: ignore[union-attr]

    return logged


def bench_compare(name: str, args: argparse.Namespace, directory: Path) -> tuple[Times, int]:
    """Part 3: the loop bare, logging to W&B (offline), to TensorBoard, to bsmon without and
    with the noise scale; one copy of the model each, interleaved blocks."""
    import wandb
    from torch.utils.tensorboard import SummaryWriter

    from bsmon.probes import attach

    os.environ["WANDB_MODE"] = "offline"
    run = wandb.init(project="bsmon-bench", dir=str(directory), settings=wandb.Settings(quiet=True))
    writer = SummaryWriter(str(directory / "tensorboard"))
    steps: dict[str, tuple[Step, object | None]] = {"bare": (make_step(name)[2], None)}
    steps["W&B offline"] = (
        logger_step(make_step(name)[2], lambda v, i: run.log({"loss": v}, step=i)),
        None,
    )
    steps["TensorBoard"] = (
        logger_step(make_step(name)[2], lambda v, i: writer.add_scalar("loss", v, i)),
        None,
    )
    monitors = []
    for variant, options in (("bsmon telemetry", {"noise_scale": None}), ("bsmon defaults", {})):
        model, optimizer, step, examples, _ = make_step(name)
        mon = attach(model, optimizer, batch_size=examples, name=variant, **options)
        steps[variant] = (step, mon)
        monitors.append(mon)
    warmed = warm_all(steps, monitors, args, "bsmon defaults")

    def block(step: Step, mon: object | None) -> Block:
        return lambda: alone(step, mon, monitors, args.block)

    try:
        return interleave({v: block(*pair) for v, pair in steps.items()}, args.rounds), warmed
    finally:
        for mon in monitors:
            mon.close()
        writer.close()
        run.finish()


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


def run_model(name: str, args: argparse.Namespace) -> None:
    _, batch, label = MODELS[name]
    print(f"\n{name}: {label.format(batch=batch)}")
    if args.agent_rounds:
        print(f"  part 1, the agent ({args.agent_rounds} rounds x {args.agent_steps} steps):")
        agent_times = bench_agent(name, args)
        print("\n".join(table(agent_times, "off")))
        wall, _, thread = (summary(agent_times, NO_ANATOMY, k)["agent"][2] for k in range(3))
        print(f"  the step anatomy: agent vs {NO_ANATOMY}: wall {wall}, training thread {thread}")
    times, share = bench_noise(name, args)
    print(f"  part 2, the noise scale ({args.rounds} rounds x {args.block} steps, vs agent):")
    print("\n".join(table(times, "agent")))
    wall, _, thread = (summary(times, FLOOR, k)["noise-every-step"][2] for k in range(3))
    print(f"  every step vs the floor (goal <= 1.03): wall {wall}, training thread {thread}")
    print(
        f"  the dense warm-up ended after {args.warmed_up} steps; then the default budget "
        f"measured {share:.1%} of steps (a moving average)"
    )
    if args.compare:
        times, warmed = bench_compare(name, args, Path(tempfile.mkdtemp(prefix="bsm-tools-")))
        print(f"  part 3, what a user would pick instead ({args.rounds} rounds, vs bare):")
        print("\n".join(table(times, "bare")))
        print(f"  (bsmon defaults timed once tracking: the warm-up took {warmed} steps)")


def start_reader(socket_path: Path) -> subprocess.Popen:
    """A monitor process that connects to ``socket_path`` (again and again, as benchmark
    blocks attach and close) and reads every message; it exits when its parent does."""
    return subprocess.Popen(
        [sys.executable, "-c", READER, str(socket_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=[*MODELS, "all"], default="all")
    parser.add_argument("--rounds", type=int, default=30, help="noise-scale rounds")
    parser.add_argument("--block", type=int, default=25, help="steps per noise-scale block")
    parser.add_argument("--agent-rounds", type=int, default=8, help="0 skips part 1")
    parser.add_argument("--agent-steps", type=int, default=100, help="steps per agent block")
    parser.add_argument("--warmup", type=int, default=30, help="untimed steps per block")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--no-record", action="store_true", help="attach with record=False (no session record)"
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="part 3: W&B (offline) and TensorBoard in the same loop (pip install wandb "
        "tensorboard)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    directory = Path(tempfile.mkdtemp(prefix="bsm-bench-", dir="/tmp"))
    os.environ["BSMON_DIR"] = str(directory)
    socket_path = directory / f"{os.getpid()}.sock"
    reader = start_reader(socket_path)
    print(
        f"torch {torch.__version__}, {args.threads} threads, {os.cpu_count()} cores; "
        "ratios are medians of paired per-round ratios"
    )
    try:
        for name in list(MODELS) if args.model == "all" else [args.model]:
            run_model(name, args)
    finally:
        reader.kill()
        reader.wait()
    print(
        "\ngoals: agent <= 1.01; the noise scale at its defaults, once tracking, <= 1.01 (MLP) "
        "and <= 1.02 (CNN, transformer) against the agent alone"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
