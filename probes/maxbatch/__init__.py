"""The max-batch-size probe: a sidecar process that trains a copy of the model's structure
at a few larger batch sizes, so an out-of-memory error never touches the job.

Modules, one job each:

- ``recipe``: what the sidecar needs, gathered in the job without touching its state;
- ``plan``: which sizes to try, the memory fit, the prediction and its confirmation, the
  recommendation;
- ``measure``: the sidecar's work (rebuild the step, run the sizes, confirm, report each);
- ``cpu_memory``: the CPU sidecar's peak resident memory, and its cap on allocations;
- ``runner``: the job's side: starts the sidecar, watches it, turns its output into a result;
- ``job``: what the job contributes: its batch, its precision, the batch control it has;
- ``seen_step``: the probe's step under ``bsmon run``, rebuilt from one training step seen;
- ``sidecar``: the entry point, ``python -m bsmon.probes.maxbatch.sidecar RECIPE``.
"""
