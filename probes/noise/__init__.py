"""The rolling gradient noise scale B_simple = tr(Σ)/|G|² (McCandlish et al. 2018).

Modules, one job each:

- ``estimators``: the unbiased two-batch-size estimators (App. A.1) in one general form;
- ``smoothing``: the ratio of two bias-corrected EMAs, its standard error and interval;
- ``drift``: a fast pair of averages beside the slow one, to follow B_simple when it moves;
- ``growth``: the averages' ratio read forward to the latest step while B_simple grows;
- ``pernorms``: per-example squared gradient norms of each supported layer (pure tensors);
- ``layers``: which layers are measured, coverage, and dispatch to ``pernorms``;
- ``sampling``: which examples of a pass a measured step takes norms of (sequence and
  image models: a rotating quarter);
- ``autograd``: end-of-backward callbacks, on-device squared norms, example counting;
- ``scaling``: the mixed-precision loss scale and the optional Adam preconditioner;
- ``source``, ``per_example``, ``microbatch``, ``ddp``, ``sharded``, ``sequential``: the
  measurement sources that run in the training job's hooks;
- ``shard_totals``: the sharded (FSDP2) estimate's step sums across ranks, through the job's
  store;
- ``zero``: where a DeepSpeed engine keeps the averaged gradient at the optimizer step
  (ZeRO-1/2 and stage 0), or why it cannot be read;
- ``step_record``: the step record handed to the agent thread without a device sync;
- ``budget``: which steps are measured, at about a fixed share of the step time;
- ``warmup``: the dense measuring at a run's start, under a cost bound;
- ``tracker``: the agent thread's side (records → smoothed reading);
- ``shared_backward``: another model's backward pass running through this one (a GAN):
  the noise scale is refused with the reason;
- ``reasons``: why the noise scale is off or measured another way, in its reader's words;
- ``controller``: ``NoiseScale``, which picks and runs all of the above for a ``Monitor``;
- ``extension``: ``NoiseExtension``, its tie to the agent (boundaries, ticks, the metrics
  message's part).

Never imports textual or rich.
"""

from __future__ import annotations

from .controller import DEFAULT_BUDGET, MODES, NoiseScale
from .extension import NoiseExtension

__all__ = ["DEFAULT_BUDGET", "MODES", "NoiseExtension", "NoiseScale"]
