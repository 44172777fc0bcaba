"""A training job for the probe tests, run as a real process.

    python tests/probe_job.py MODE OUT [--probe-at STEP] [--budget BYTES]

MODE "twin": train with a fixed seed and write the final weights, optimizer state, RNG
states and the order of samples to OUT (a probe at --probe-at must not change any of them).
MODE "probe": probe with a model class defined here in __main__ and write the result to OUT.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys

import torch
from torch import nn

from bsmon.probes import attach


class MainModel(nn.Module):  # defined in __main__: the recipe must carry it by value
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(32, 128), nn.Tanh(), nn.Linear(128, 4))
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x) * self.scale


class IndexedData(torch.utils.data.Dataset):
    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(5)
        self.x = torch.randn(2048, 32, generator=generator)
        self.y = torch.randint(0, 4, (2048,), generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i], i


def digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("twin", "probe"))
    parser.add_argument("out")
    parser.add_argument("--probe-at", type=int, default=0)
    parser.add_argument("--budget", type=int, default=600 << 20)
    args = parser.parse_args()
    torch.manual_seed(0)
    random.seed(0)
    model = MainModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    loss_fn = nn.CrossEntropyLoss()

    def probe_step(m: nn.Module, batch) -> torch.Tensor:
        x, y, _ = batch
        return loss_fn(m(x), y)

    order, out = [], {}
    with attach(
        model,
        optimizer,
        batch_size=32,
        max_batch_size=2048,
        name="probe-job",
        probe_step=probe_step,
    ) as mon:
        loader = mon.dataloader(IndexedData(), shuffle=True)
        for _epoch in range(2):
            for x, y, ids in loader:
                loss = loss_fn(model(x), y) + 0.0 * torch.rand(())  # consumes the torch RNG
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                order.extend(ids.tolist())
                if args.probe_at and mon.step == args.probe_at:
                    result = mon.probe(memory_budget=args.budget, timeout=180)
                    out["probe"] = {
                        "status": result.status,
                        "error": result.error,
                        "max": result.max_batch_size,
                        "sizes": len(result.points),
                    }
                    if args.mode == "probe":
                        break
            if args.mode == "probe":
                break
    if args.mode == "twin":
        state = optimizer.state_dict()["state"]
        out.update(
            weights=digest(model.parameters()),
            optimizer=digest(
                t for s in state.values() for t in s.values() if isinstance(t, torch.Tensor)
            ),
            torch_rng=digest([torch.get_rng_state()]),
            python_rng=hashlib.sha256(repr(random.getstate()).encode()).hexdigest(),
            order=hashlib.sha256(json.dumps(order).encode()).hexdigest(),
            steps=len(order),
        )
    with open(args.out, "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
