"""What bsmon adds to the training thread per step, in machine instructions: a figure that
does not move with the machine's load, beside ``hostcost.py``'s microseconds, which do.

Each configuration of ``hostcost.py`` runs in its own process under valgrind's callgrind,
one file per thread; only the timed steps are counted (collection is switched on inside
``functools.reduce``, which runs them, and instrumentation once the imports are done), and
only the training thread's file is read. The agent thread's tick is stretched to 3 s, since
callgrind runs the job ~50× slower and a 0.1 s tick would then come every few steps instead
of every ~660; the step anatomy samples one step in 130, what it settles at on this step.
The figures are instructions, not time: a cache miss or a wait for the GIL costs no
instruction, so hostcost's wall time stays the measure the goals are stated in. Run with
the address space unrandomised (``setarch -R``), bare and the floor repeat to the
instruction, telemetry and the step anatomy to within ~200 a step (where the agent's ticks
fall among the timed steps); the record's writes on the agent thread interleave less
evenly (+6,500 and +13,000 in two runs).

``--agent`` counts the other side: the agent's tick, which the training thread waits for
through the GIL. The agent thread is left idle and the job's thread runs the ticks itself,
one after each run of ``--tick-steps`` steps (about a real tick's worth on this step), so
that each tick is counted whole and at the same place; printed per step.

Configurations with the noise scale on are left out: its budget is kept in time, which
callgrind stretches unevenly (the same ``bsmon run`` block measured +43,000 and +498,000).

    python benchmarks/instructions.py                   # bare, floor, telemetry, + anatomy
    python benchmarks/instructions.py --only floor telemetry --steps 1000
    python benchmarks/instructions.py --agent --steps 5000   # telemetry, anatomy, record

Needs valgrind (Debian: ``apt install valgrind``); says so and exits 2 without it.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT = ("bare", "floor", "telemetry", "+ step anatomy")
AGENT_DEFAULT = ("telemetry", "+ step anatomy", "+ record")
TIMED_BUDGET = ("defaults", "noise scale", "bsmon run")  # the noise scale on: not repeatable
TICK_S = 3.0
AGENT_IDLE_S = 1000.0  # --agent: the job's thread runs the ticks
ANATOMY_STRIDE = "130"
# the same addresses every run: the allocator's paths depend on them
NO_ASLR = ["setarch", os.uname().machine, "-R"] if shutil.which("setarch") else []
SUMMARY = re.compile(r"^summary:\s+(\d+)", re.MULTILINE)


def child(config: str, steps: int, warmup: int, tick_steps: int = 0) -> None:
    """In the process under callgrind: set the configuration up, then run the timed steps
    inside ``functools.reduce`` (the function collection is switched on for); with
    ``tick_steps``, the steps outside it and a tick inside it after each ``tick_steps``."""
    import torch

    sys.path.insert(0, str(HERE))
    from hostcost_kit.setups import CONFIGS, make_loop

    from bsmon.probes.runtime import logged, service

    # the tick's period, and the one over which the logging rate is judged
    service.TICK_S = logged.TICK_S = AGENT_IDLE_S if tick_steps else TICK_S
    torch.set_num_threads(1)
    name = next(n for n in CONFIGS if n.startswith(config))
    loop = make_loop("tiny")
    instrument = ["callgrind_control", "-i", "on", str(os.getpid())]
    subprocess.run(instrument, check=False, capture_output=True)
    with CONFIGS[name](loop) as monitor:
        for _ in range(warmup):
            loop.step()
        if not tick_steps:
            functools.reduce(lambda _, __: loop.step(), range(steps), None)
            return
        tick = monitor._service.tick  # the agent thread idles meanwhile (AGENT_IDLE_S)
        tick()
        for _ in range(steps // tick_steps):
            for _ in range(tick_steps):
                loop.step()
            functools.reduce(lambda _, __: tick(), range(1), None)


def measure(config: str, steps: int, warmup: int, where: Path, tick_steps: int = 0) -> int:
    """Instructions the training thread ran over ``steps`` timed steps of ``config`` (with
    ``tick_steps``: in the ticks after them)."""
    out = where / f"{abs(hash(config))}.out"
    command = [
        *NO_ASLR,
        "valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
        "--toggle-collect=functools_reduce", "--separate-threads=yes",
        f"--callgrind-out-file={out}",
        sys.executable, __file__, "--child", config, "--steps", str(steps),
        "--warmup", str(warmup), "--tick-steps", str(tick_steps),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONHASHSEED": "0", "BSMON_ANATOMY_STRIDE": ANATOMY_STRIDE}
    done = subprocess.run(command, check=False, capture_output=True, text=True, env=env)
    main_thread = Path(f"{out}-01")
    if done.returncode != 0 or not main_thread.exists():
        raise RuntimeError(f"{config}: callgrind failed: {done.stderr[-2000:]}")
    found = SUMMARY.search(main_thread.read_text())
    if found is None:
        raise RuntimeError(f"{config}: no summary line in {main_thread}")
    return int(found[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="CONFIG")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=800)
    parser.add_argument("--agent", action="store_true", help="the agent's tick, per step")
    parser.add_argument("--tick-steps", type=int, default=500, help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps, args.warmup, args.tick_steps)
        return 0
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("instructions.py needs valgrind (apt install valgrind); nothing measured")
        return 2
    if args.agent:
        args.only = args.only or list(AGENT_DEFAULT)
        return agent_ticks(args)
    args.only = args.only or list(DEFAULT)
    configs = ["bare", *[c for c in args.only if c != "bare"]]
    for config in [c for c in configs if c.startswith(TIMED_BUDGET)]:
        print(f"{config}: left out, the noise scale's budget is kept in time (see the docstring)")
        configs.remove(config)
    with (
        tempfile.TemporaryDirectory(prefix="bsm-instr-") as where,
        ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool,
    ):
        counted = pool.map(lambda c: measure(c, args.steps, args.warmup, Path(where), 0), configs)
        counts = dict(zip(configs, counted, strict=True))
    bare = counts["bare"] / args.steps
    floor = counts.get("floor")
    print(f"\ninstructions per step on the training thread, {args.steps} timed steps, tiny model")
    print(f"{'bare':40} {bare:>10,.0f}")
    for config in configs[1:]:
        added = counts[config] / args.steps - bare
        ratio = f"   {added / (floor / args.steps - bare):.2f}× the floor" if floor else ""
        print(f"{config:40} {added:>+10,.0f}{ratio if config != 'floor' else ''}")
    return 0


def agent_ticks(args: argparse.Namespace) -> int:
    """The agent's ticks, for the configurations that have an agent."""
    without_agent = ("bare", "floor", *TIMED_BUDGET)
    configs = [c for c in args.only if not c.startswith(without_agent)]
    steps = max(args.steps // args.tick_steps, 1) * args.tick_steps
    with (
        tempfile.TemporaryDirectory(prefix="bsm-instr-") as where,
        ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool,
    ):
        measured = pool.map(
            lambda c: measure(c, steps, args.warmup, Path(where), args.tick_steps), configs
        )
        counts = dict(zip(configs, measured, strict=True))
    print(f"\ninstructions of the agent's ticks per step, a tick every {args.tick_steps} steps")
    for config, count in counts.items():
        print(f"{config:40} {count / steps:>+10,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
