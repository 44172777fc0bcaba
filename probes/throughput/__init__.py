"""Tokens per second and model FLOPs utilization (MFU): how much of the device's peak the
training step's matmuls reach, at whatever batch size the job runs now.

Modules, one job each:

- ``extension``: the training thread's look at one training call now and then (its input's
  shape, its precision) and each metrics message's ``throughput`` part (agent thread);
- ``flops``: one training step's FLOPs per example, counted once on the meta device;
- ``peak``: the device's dense peak FLOP/s by name and precision, from NVIDIA's datasheets.

Never imports textual or rich.
"""

from __future__ import annotations
