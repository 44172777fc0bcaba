"""The noise scale's cost with CUDA: benchmarks/overhead.py's part 2 on the GPU.

Three copies of each model (the agent alone, the estimator under its default budget, the
estimator on every step) train in interleaved blocks, each block bracketed by
``torch.cuda.synchronize()`` so it counts the device's work; the steps inside never wait.
Batches are larger than on the CPU so that the GPU, not the launch queue, sets the pace.
"""

from __future__ import annotations

import argparse

from .procs import Deadline
from .report import Criterion, Finding, Table, missed

GPU_BATCHES = {"mlp": 2048, "cnn": 256, "transformer": 64}
GOAL = 1.03  # the noise scale at its default budget, against the agent alone
ARGS = argparse.Namespace(rounds=30, block=25, warmup=30)


def run(deadline: Deadline) -> Finding:
    import torch
    from overhead_kit.blocks import summary
    from overhead_kit.models import MODELS
    from overhead_kit.noise import FLOOR, bench_noise

    rows, criteria, figures = [], [], {}
    for name, batch in GPU_BATCHES.items():
        deadline.require(15, f"the {name} model")
        times, share = bench_noise(name, ARGS, "cuda", batch, torch.cuda.synchronize)
        rates = summary(times, "agent")
        default, every = rates["noise"], rates["noise-every-step"]
        vs_floor = summary(times, FLOOR)["noise-every-step"]
        label = MODELS[name][2].format(batch=batch)
        rows.append(
            [
                label,
                f"{rates['agent'][0] * 1e3:.2f} ms",
                f"{default[1]:.3f} ({default[2]})",
                f"{every[1]:.3f} ({every[2]})",
                f"{vs_floor[1]:.3f} ({vs_floor[2]})",
                f"{share:.1%}",
            ]
        )
        criteria.append(
            Criterion(
                f"{name}: noise scale at its default budget / agent alone",
                f"{default[1]:.3f}",
                f"≤ {GOAL}",
                default[1] <= GOAL,
            )
        )
        criteria.append(
            Criterion(
                f"{name}: every step / the floor (minimal hooks, same formulas)",
                f"{vs_floor[1]:.3f}",
                "information (CPU goal ≤ 1.03)",
                None,
            )
        )
        criteria.append(
            Criterion(
                f"{name}: noise scale on every step / agent alone",
                f"{every[1]:.3f}",
                "information",
                None,
            )
        )
        figures[name] = {
            "batch": batch,
            "agent_step_s": rates["agent"][0],
            "default_ratio": default[1],
            "every_step_ratio": every[1],
            "every_step_vs_floor": vs_floor[1],
            "share_measured": share,
        }
    table = Table(
        [
            "model",
            "agent alone, per step",
            "default budget: ratio of medians (paired [IQR])",
            "every step: ratio of medians (paired [IQR])",
            "every step / floor",
            "steps measured",
        ],
        rows,
        title=f"{ARGS.rounds} rounds × {ARGS.block} steps per block, wall time",
    )
    over = missed(criteria)
    return Finding(
        summary="default budget ≤ 1.03× on every model"
        if not over
        else f"over 1.03× at the default: {', '.join(over)}",
        criteria=criteria,
        tables=[table],
        figures=figures,
        notes=["The agent's own cost is measured by the timing check; these ratios are on top."],
    )
