"""Batch size: the user's keys and commands (or the autopilot) turned into a new batch size at
a step boundary.

Modules, one job each:

- ``control``: requests checked on the agent thread, applied on the training thread;
- ``extension``: the batch-size commands, and the agent-thread side of the controller;
- ``policy``: which sizes the keys step to, and which are refused (and why);
- ``loader``: a DataLoader whose batch size follows the monitor, batch by batch;
- ``script_loader``: the batch size of a DataLoader the script built itself (``--resizable``);
- ``lr_scaling``: the learning rate rescaled with the batch size (auto: linear for SGD, sqrt
  for Adam-type; or chosen; or none); ``adam_rules``: what an Adam-type optimizer's moments,
  β2 and weight decay do at a change;
- ``safety``: which sizes ask first (not measured to fit; more than 2× from the last size
  that trained well);
- ``watch``: after each change, its throughput verdict (``verdict``: by standard error), its
  measured progress per example (``progress``: the loss against the old size's own curve
  carried on, the measured signal beside B_simple) and whether the loss held, or diverged and
  perhaps recovered (``loss_watch``);
- ``memory_model``: the job's peak memory per batch size, fitted by a line; ``footprint``:
  what a rank holds whatever its batch (under FSDP2 its shards, and the groups gathered whole);
- ``advisor``: the one answer to "which batch size?" (memory, step time, the noise scale's
  efficiency, the guards), which every surface shows; its model (``goodput``: step time
  fitted per size, efficiency from the noise scale; ``regather``: a sharded job's price of
  growing by accumulation) and the rules that hold a size (``autopilot_holds``);
- ``autopilot``: acts on the advisor's answer, switched on by the user; the gain it claims
  (``gain_claim``), whether the job moves the learning rate itself (``lr_owner``), a trial of
  the next size where B_simple holds just short of it (``autopilot_trial``);
- ``oom``: out-of-memory errors recognised, from CUDA, ROCm, MPS or the CPU allocator;
  ``oom_recovery``: ``mon.guard()``'s recovery from one (a smaller size, samples re-queued).
"""
