"""The max-batch-size probe: a sidecar process that trains a copy of the model's structure
at a few larger batch sizes, so an out-of-memory error never touches the job.

- ``recipe``: what the sidecar needs, gathered in the job without touching its state.
- ``plan``: which sizes to try, the memory fit, the prediction, what-ifs, the recommendation.
- ``measure``: the sidecar itself (``python -m bsmon.probes.maxbatch.sidecar RECIPE``).
- ``runner``: the job's side: starts the sidecar, watches it, turns its output into a result.
"""
