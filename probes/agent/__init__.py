"""The agent: ``attach()`` and the ``Monitor``, the part of bsmon that lives inside the training
job, and how its parts are joined.

- ``monitor``: ``attach``, ``Monitor`` (DESIGN.md's public calls and ``close``), live monitors;
- ``options``: ``attach()``'s options, checked before anything is built;
- ``assemble``: the composition root: options → every wing's part, joined;
- ``job``: ``Monitor.job``, what bsmon's own integrations reach beneath the ``Monitor``;
- ``serving``: the socket (and its metadata) and the session record;
- ``boundary``: the training thread's scheduled slow path (``StepWork.on_boundary``);
- ``accounting``: the job's DataLoader, ``train()``/``eval()`` and ``mon.dataloader`` signals →
  samples and evaluation time.

The training thread's part is ``runtime.hot_path``: per ordinary step one ``perf_counter`` and
a few stores in the optimizer's post-hook, and one append per ``mon.log``. Aggregation, device
sampling and the socket live on the agent's daemon threads (``runtime.service.AgentService``).
"""

from __future__ import annotations

from .monitor import Monitor, attach, live_monitors

__all__ = ["Monitor", "attach", "live_monitors"]
