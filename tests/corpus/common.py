"""What the corpus scripts share: seeding, and attaching when CORPUS_ATTACH is set."""

from __future__ import annotations

import os

import torch


def setup(seed: int = 0) -> None:
    torch.manual_seed(seed)
    torch.set_num_threads(1)


def maybe_attach(model: torch.nn.Module | None, optimizer: torch.optim.Optimizer, **options):
    """Attach bsmon the way a user instruments a script (only when the test asks for it)."""
    if not os.environ.get("CORPUS_ATTACH"):
        return None
    from bsmon.probes import attach

    return attach(model, optimizer, **options)
