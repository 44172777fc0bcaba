"""The sharded case of benchmarks/hostcost.py: workloads/sharded_job.py's small transformer on
torchrun's gloo ranks, sharded with FSDP2 (``fsdp2``) or replicated with DDP (``ddp``, the same
model for comparison), counted and timed on every rank as the unsharded step is. One process a
rank (``hostcost.py --sharded`` starts them, and tests/processes/test_hot_path_sharded.py):

    PYTHONPATH=benchmarks python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        -m hostcost_kit.sharded --wrap fsdp2 --out DIR [--counts-only] [--only WORD...]

Each rank writes DIR/rank<N>.json: its call counts, its timed blocks (each less its bare
neighbours) and its bare step. The ranks run the same configurations in the same order and
the same number of steps (a collective in every step holds them in step), so each block of
one rank is timed while the other runs the same block.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, astuple, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from .counting import count_calls
from .setups import CONFIGS, Loop, bare
from .timing import BRACKET_WARMUP, time_block, time_configs

ROOT = Path(__file__).resolve().parents[2]
BATCH, BLOCK = 16, 16  # examples per rank, tokens per example: sharded_job.py's defaults
SETTLED = 400  # a bsmon block's warm-up: a few of the agent's ticks at a step of a few ms
COUNTED = ("telemetry", "+ record", "defaults (noise", "bsmon run (zero-code)")
# the goals' configurations and their floors; the noise scale at its budget (DDP's comm hook)
TIMED = ("floor", "telemetry", "+ record", "defaults (noise")


@dataclass
class ShardedLoop(Loop):
    """The step of one rank: a sequence model's logits against its next tokens."""

    vocab: int = 0

    def __post_init__(self) -> None:
        vocab = self.vocab
        self.criterion = lambda logits, targets: torch.nn.functional.cross_entropy(
            logits.reshape(-1, vocab), targets.reshape(-1)
        )

    def all_done(self, done: bool) -> bool:
        """Every rank is ``done`` (a collective: the ranks take as many steps as each other)."""
        flag = torch.tensor([int(done)])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())


def sharded_loop(wrap: str) -> Loop:
    """sharded_job.py's model and optimizer, wrapped, and one batch of this rank's text."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from workloads.sharded_job import VOCAB, TinyLM, corpus
    from workloads.sharded_job import wrap as wrap_model

    torch.manual_seed(0)
    model = wrap_model(TinyLM(), wrap)
    text = corpus()
    gen = torch.Generator().manual_seed(dist.get_rank())
    ix = torch.randint(len(text) - BLOCK - 1, (BATCH,), generator=gen)
    x = torch.stack([text[i : i + BLOCK] for i in ix])
    y = torch.stack([text[i + 1 : i + 1 + BLOCK] for i in ix])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    return ShardedLoop(model, optimizer, x, y, vocab=VOCAB)


def chosen(words: tuple[str, ...], only: list[str] | None) -> list[str]:
    names = [n for n in CONFIGS if any(w in n for w in words)]
    return [n for n in names if not only or any(w in n for w in only)]


def measure(args: argparse.Namespace) -> dict:
    """This rank's counts and, unless ``--counts-only``, its timed blocks."""
    counts = {
        name: asdict(count_calls(CONFIGS[name], args.wrap, steps=args.counted, warmup=120))
        for name in chosen(COUNTED, args.only)
    }
    result: dict = {"rank": dist.get_rank(), "wrap": args.wrap, "counts": counts}
    if args.counts_only:
        return result
    names = ["bare", *chosen(TIMED, args.only)]
    began = time.perf_counter()
    added = time_configs(names, args.wrap, args.rounds, args.steps, settled=SETTLED)
    result["blocks"] = {name: [astuple(b) for b in blocks] for name, blocks in added.items()}
    alone = time_block(bare, sharded_loop(args.wrap), args.steps, BRACKET_WARMUP)
    result["bare_step_s"] = alone.ordinary  # what the added µs are a share of
    result["timed_s"] = time.perf_counter() - began
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wrap", choices=("fsdp2", "ddp"), default="fsdp2")
    parser.add_argument("--out", required=True, help="a folder for each rank's JSON")
    parser.add_argument("--counts-only", action="store_true")
    parser.add_argument("--only", nargs="+", metavar="WORD")
    parser.add_argument("--counted", type=int, default=200, help="steps counted per setup")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=300, help="timed steps per block")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        result = measure(args)
        Path(args.out, f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
