"""The checks, in the order they run, each with its time budget and what "pass" means.

The budgets add up to under 12½ minutes, the probe's 7 of them (its brute force: one fresh
process per trial, ~10 s each on an H100; the arithmetic is in probe_check's docstring). A
check that is still running when its budget is spent is stopped (with everything it started)
and reported as failed.
"""

from __future__ import annotations

from .runner import Check

TOTAL_BUDGET_S = 12 * 60 + 30

CHECKS: tuple[Check, ...] = (
    Check(
        "nvml",
        "NVML readings against nvidia-smi",
        40,
        "while a job keeps the GPU busy, the utilization, memory used and total, temperature "
        "and power in the agent's metrics match nvidia-smi read at the same moments (median "
        "gaps ≤ 10 points, max(256 MiB, 1%), 1%, 3 °C, max(25 W, 15%)), and the torch "
        "allocator figures are ordered allocated ≤ reserved ≤ the job's memory in NVML.",
        "gpucheck.nvml_check:run",
    ),
    Check(
        "timing",
        "CUDA-event step times; no synchronization on the training thread",
        60,  # 22 s on the H100 (docs/gpu-report.md)
        "the agent's CUDA-event step time is within 3% of synchronize-bracketed timing of the "
        "same steps (its reported window mean within 5%); the step time with the agent "
        "attached is ≤ 1.01× without it (interleaved blocks, ratio of medians); and training "
        "with the agent (noise scale on every step) under sync debug mode 'error' raises "
        "nothing.",
        "gpucheck.timing_check:run",
    ),
    Check(
        "probe",
        "The probe against the real out-of-memory boundary",
        420,
        "for a ResNet-style CNN and a GPT-style transformer the probe runs ≤ 3 sizes (plus a "
        "confirmation); its predicted largest batch (before the 5% margin) is within 5% of the "
        "boundary found by brute force in fresh processes (a search from the probe's own "
        "bounds, to within 1%), and within the boundary with the margin; the batch size it "
        "recommends does not run out of memory; its measured what-ifs (bf16, activation "
        "checkpointing) are within 10% of their own boundaries (searched to within 3%); the "
        "job's memory model is within 10% of the measured peak; the job keeps training during "
        "the probe.",
        "gpucheck.probe_check:run",
    ),
    Check(
        "noise",
        "The noise scale's cost with CUDA",
        80,
        "on the MLP, CNN and transformer of benchmarks/overhead.py, the step time with the "
        "noise scale at its default budget is ≤ 1.03× the agent's alone (interleaved blocks, "
        "ratio of medians); on every step it is reported, against the agent alone and against "
        "the floor (the least machinery computing the same per-example norms).",
        "gpucheck.noise_check:run",
    ),
    Check(
        "anatomy",
        "The step anatomy against synchronized phases",
        30,
        "on the CNN with CUDA, the anatomy's forward, backward and optimizer shares of the "
        "step, over 4 of its 100-step windows, are each within 5 points of the shares of "
        "steps synchronized at each phase boundary, in blocks interleaved with them (the "
        "profiler's kernel time per phase is reported).",
        "gpucheck.anatomy_check:run",
    ),
    Check(
        "mfu",
        "MFU against a hand count",
        20,
        "the GPT-style model in bf16 with the agent attached: its MFU (FLOPs counted on the "
        "meta device × its samples/s over the device's table peak) is within 5% of a hand "
        "count, 6·N + 12·L·T·d FLOPs per token × tokens/s measured over synchronized blocks "
        "over the same peak.",
        "gpucheck.mfu_check:run",
    ),
    Check(
        "dashboard",
        "The dashboard creates no CUDA context",
        40,
        "`bsmon attach` on a CUDA job shows it LIVE while NVML's process list holds the job "
        "and not the dashboard, the count of GPU processes does not change, no CUDA library is "
        "mapped in the dashboard's processes, and q quits it.",
        "gpucheck.dashboard_check:run",
    ),
    Check(
        "pytest",
        "pytest -m gpu",
        55,
        "every test marked gpu runs and passes (none skipped) and pytest exits 0.",
        "gpucheck.pytest_check:run",
    ),
)
