"""A small transformer trained data-parallel by torchrun's ranks (gloo, CPU), either with
DistributedDataParallel or sharded with FSDP2 (``fully_shard`` on each block, then the root),
on the same data from the same seed: the noise-scale tests and ``benchmarks/sharded_noise.py``
compare the two.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \
        workloads/sharded_job.py --wrap fsdp2 --attach

Every rank draws its own batches from a generator seeded with (seed, rank), so the runs of
both wraps see the same examples in the same order and, from the same initial weights, train
the same model up to rounding. ``--attach`` calls ``attach()`` and, at the end, prints one JSON
line per rank (or, with ``--results DIR``, writes DIR/rank<N>.json): its step and sample
counts, its noise-scale reading, its step anatomy and (rank 0) its ranks view. Without it the script
prints only its losses (what ``bsmon run`` must leave as it is). ``--accumulate N``: N
micro-batches of ``--batch`` examples per optimizer step, each reduced as it ends.
``--memory`` (with ``--attach``) adds what batch control read of the rank's memory footprint
beside the same figures counted here from the model, what ``mon.probe()`` answered, and (rank
0) the advisor's price of one more micro-batch; ``--micro`` attaches in accumulation mode.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "corpus"))

from gpt import Block  # the corpus GPT's block: attention, MLP, LayerNorm

if TYPE_CHECKING:
    from bsmon.probes.agent.monitor import Monitor

VOCAB = 24


class TinyLM(nn.Module):
    """Embedding, the corpus GPT's blocks, LayerNorm, head: every parameter measurable per
    example (no tied weights, no position embedding broadcast over the batch)."""

    def __init__(self, width: int = 32, layers: int = 2) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, width)
        self.blocks = nn.ModuleList(Block(width, 4) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def corpus(length: int = 8192) -> torch.Tensor:
    """A periodic sequence with noise: learnable, never learnt to zero loss."""
    gen = torch.Generator().manual_seed(1234)
    text = torch.tensor([math.floor(10 * (1 + math.sin(i / 3))) for i in range(length)])
    return (text + torch.randint(0, 4, text.shape, generator=gen)) % VOCAB


def wrap(model: nn.Module, how: str) -> nn.Module:
    if how == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    if how == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        return fully_shard(model)
    if how == "hsdp":  # shards within pairs of ranks, replicated across the pairs
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        shape = (dist.get_world_size() // 2, 2)
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard"))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    if how == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel

        return FullyShardedDataParallel(model, device_id=torch.device("cpu"))
    return model


def memory_report(mon: Monitor, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Batch control's reading of this rank's footprint (read by bsmon's agent thread once a
    step has run and a memory sample came: waited for here, up to 60 s), the same bytes
    counted here, and the probe's answer."""
    control = mon.job.batch_control
    deadline = time.monotonic() + 60
    while control.host_memory.footprint is None and time.monotonic() < deadline:
        mon.flush()  # a tick of the agent thread, which reads memory samples as they come
        time.sleep(0.1)
    footprint = control.host_memory.footprint
    probe = mon.probe()
    advisor = mon.job.autopilot.advisor if mon.job.autopilot is not None else None  # rank 0
    regather = advisor.regather.at(control.size) if advisor and advisor.regather else None
    return {
        "regather": dataclasses.asdict(regather) if regather is not None else None,
        "footprint": dataclasses.asdict(footprint) if footprint is not None else None,
        "local_bytes": sum(_nbytes(p.to_local()) for p in model.parameters()),
        "whole_bytes": sum(_nbytes(p) for p in model.parameters()),
        "state_bytes": sum(
            _nbytes(v.to_local() if hasattr(v, "to_local") else v)
            for state in optimizer.state.values()
            for v in state.values()
            if isinstance(v, torch.Tensor)
        ),
        "block_bytes": sum(_nbytes(p) for p in model.blocks[0].parameters()),
        "probe": [probe.status, probe.error],
        "probe_blocked": mon.job.prober.reading().blocked,
    }


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--wrap", choices=("ddp", "fsdp2", "hsdp", "fsdp1", "none"), default="fsdp2"
    )
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=16, help="per rank")
    parser.add_argument("--block", type=int, default=16, help="tokens per example")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per step")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--attach", action="store_true")
    parser.add_argument("--results", default=None, help="with --attach: a folder for them")
    parser.add_argument("--noise", default="auto", help="attach()'s noise_scale")
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    parser.add_argument("--memory", action="store_true", help="with --attach: footprint, probe")
    parser.add_argument(
        "--micro", action="store_true", help="attach in accumulation mode: micro-batches of --batch"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    model = wrap(TinyLM(), args.wrap)
    if args.optimizer == "adam":
        optimizer: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    mon = None
    if args.attach:
        from bsmon.probes import attach

        name = f"sharded-{args.wrap}"
        per_step = args.batch * args.accumulate
        micro = args.batch if args.micro else None
        mon = attach(
            model,
            optimizer,
            batch_size=per_step,
            micro_batch_size=micro,
            name=name,
            noise_scale=args.noise,
        )
    text = corpus()
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    for step in range(args.steps):
        for _ in range(args.accumulate):
            ix = torch.randint(len(text) - args.block - 1, (args.batch,), generator=gen)
            x = torch.stack([text[i : i + args.block] for i in ix])
            y = torch.stack([text[i + 1 : i + 1 + args.block] for i in ix])
            loss = F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
            (loss / args.accumulate).backward()
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0 and step % 50 == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
    memory = memory_report(mon, model, optimizer) if mon is not None and args.memory else None
    if mon is not None:
        mon.flush()
        capability = mon._noise.capability
        mon.close()  # the ranks' last measured steps come back as it closes
        stats = mon.stats()
        result = {
            "rank": rank,
            "wrap": args.wrap,
            "step": stats["step"],
            "samples": stats.get("samples"),
            "throughput": stats["throughput"],
            "noise": stats["noise"],
            "anatomy": stats["anatomy"],
            "ranks": stats["ranks"],
            "errors": stats["errors"],
            "capability": [capability.available, capability.reason],
            "memory": memory,
        }
        if args.results:  # torchrun's ranks share one stdout, where long lines interleave
            Path(args.results, f"rank{rank}.json").write_text(json.dumps(result))
        else:
            print(json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
