"""How far behind the truth the live noise scale is (``benchmarks/autopilot.py --lag``): the
exact B_simple from every example's own gradient, at checkpoints of a run under bsmon."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch
from noise_tracking_kit.exact import exact_noise
from torch import nn
from torch.utils.data import DataLoader

from .tasks import DATA_SEED, LossFn, Task, whole_batch
from .training import train_step


def exact_parts(
    model: nn.Module, loss: LossFn, inputs: torch.Tensor, labels: torch.Tensor
) -> tuple[float, float]:
    """tr Σ and |G|² of the model as it is, from every example's own gradient over
    ``inputs``, both unbiased (``noise_tracking_kit.exact``)."""
    found = exact_noise(model, loss, inputs, labels)
    return found.trace, found.g2


@dataclass(frozen=True)
class LagRow:
    """At a checkpoint step: the exact B_simple of the weights then (``point``), the exact
    ratio of the means of tr Σ and |G|² over ``WINDOW_POINTS`` weights evenly spread over the
    last ``AGE_SHARE`` of the steps so far (``window``: what averages reaching back that far
    would read, were every step measured), and the monitor's live estimate."""

    step: int
    point: float
    window: float
    live: float | None


WINDOW_POINTS = 8


def window_steps(checkpoint: int) -> list[int]:
    """The steps whose weights make a checkpoint's window: ``WINDOW_POINTS`` steps evenly
    spread over the last quarter of the run (the noise scale's young-run horizon), ending at
    the checkpoint."""
    from bsmon.probes.noise.smoothing import AGE_SHARE

    span = AGE_SHARE * checkpoint
    return sorted(
        {max(1, round(checkpoint - span * k / WINDOW_POINTS)) for k in range(WINDOW_POINTS)}
    )


def noise_lag(
    task: Task, batch: int, lr: float, seed: int, checkpoints: list[int], examples: int = 16_384
) -> list[LagRow]:
    """Train ``batch`` fixed under bsmon (its noise scale at the defaults) and, at each
    checkpoint step, a ``LagRow``: the exact values on ``examples`` training examples (a fixed
    draw: with φ near their count the estimate of |G|² is noisy)."""
    from bsmon.probes import attach

    data = task.data()
    draw = torch.Generator().manual_seed(DATA_SEED)
    probe = DataLoader(
        data.train, batch_size=examples, shuffle=True, generator=draw, collate_fn=whole_batch
    )
    probe_inputs, probe_labels = next(iter(probe))
    torch.manual_seed(seed)
    model = task.model()
    optimizer = task.optimizer(model.parameters(), lr)
    mon = attach(model, optimizer, batch_size=batch, record=False, serve=False)
    order = torch.Generator().manual_seed(seed)
    loader = mon.dataloader(data.train, shuffle=True, generator=order, collate_fn=whole_batch)
    wanted = {step for checkpoint in checkpoints for step in window_steps(checkpoint)}
    weights: dict[int, dict[str, torch.Tensor]] = {}
    live: dict[int, float | None] = {}
    try:
        while mon.step < max(checkpoints):
            for inputs, labels in loader:
                mon.log(loss=train_step(task, model, optimizer, inputs, labels))
                if mon.step in wanted:
                    weights[mon.step] = {
                        k: v.detach().clone() for k, v in model.state_dict().items()
                    }
                if mon.step in checkpoints:
                    mon.flush()
                    live[mon.step] = mon.noise_scale
                if mon.step >= max(checkpoints):
                    break
    finally:
        mon.close()
    # the exact values come afterwards, on a twin: run on the monitored model, every
    # example's forward would pass through bsmon's hooks, and minutes between two steps
    # would read as one step's time
    twin = task.model()
    parts = {}
    for step, state in sorted(weights.items()):
        twin.load_state_dict(state)
        parts[step] = exact_parts(twin, task.loss, probe_inputs, probe_labels)
    rows = []
    for checkpoint in checkpoints:
        trace, g2 = parts[checkpoint]
        window = [parts[step] for step in window_steps(checkpoint)]
        mean_trace = statistics.fmean(t for t, _ in window)
        mean_g2 = statistics.fmean(g for _, g in window)
        rows.append(LagRow(checkpoint, trace / g2, mean_trace / mean_g2, live[checkpoint]))
    return rows
