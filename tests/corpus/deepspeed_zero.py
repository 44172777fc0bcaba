"""DeepSpeed ZeRO on two CPU ranks (gloo), launched by torchrun: ``deepspeed.initialize`` with
the script's own torch SGD, ``engine.backward`` and ``engine.step``, a DataLoader over a
DistributedSampler. ``--engine ddp`` trains the same model on the same batches with torch's
DistributedDataParallel instead (the reference for the noise scale). Rank 0 prints the loss at
each epoch's end. DeepSpeed runs on a CPU with its CPU accelerator (DS_ACCELERATOR=cpu)."""

from __future__ import annotations

import argparse
import logging
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from common import maybe_attach, setup


def with_deepspeed(model: nn.Module, optimizer: torch.optim.Optimizer, args) -> nn.Module:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)  # its log lines carry the time
    deepspeed.init_distributed(dist_backend="gloo")
    config = {
        "train_micro_batch_size_per_gpu": args.batch,
        "zero_optimization": {"stage": args.stage},
        "zero_allow_untested_optimizer": True,  # a torch SGD, not one of DeepSpeed's own
        "gradient_clipping": args.clip,
    }
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", choices=("deepspeed", "ddp"), default="deepspeed")
    parser.add_argument("--stage", type=int, default=2)
    parser.add_argument("--clip", type=float, default=1.0, help="DeepSpeed's own default")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--local_rank", type=int, default=0)  # the deepspeed launcher's
    args = parser.parse_args()
    setup()
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.002)
    if args.engine == "deepspeed":
        model = with_deepspeed(model, optimizer, args)

        def train_step(loss: torch.Tensor) -> None:
            model.backward(loss)
            model.step()
    else:
        dist.init_process_group("gloo")
        model = DistributedDataParallel(model)
        # attached by the test as the reference: per-example norms, as under ZeRO
        maybe_attach(model, optimizer, batch_size=args.batch, noise_scale="per_example")

        def train_step(loss: torch.Tensor) -> None:
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    x = torch.randn(1280, 6)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    loader = DataLoader(
        data, batch_size=args.batch, sampler=DistributedSampler(data, shuffle=False)
    )
    for epoch in range(args.epochs):
        for inputs, targets in loader:
            loss = nn.functional.mse_loss(model(inputs), targets)
            train_step(loss)
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
