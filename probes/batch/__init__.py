"""Batch size: the user's keys and commands turned into a new batch size at a step boundary.

Modules, one job each:

- ``control``: requests checked on the agent thread, applied on the training thread;
- ``extension``: the batch-size commands, and the agent-thread side of the controller;
- ``policy``: which sizes the keys step to, and which are refused (and why);
- ``loader``: a DataLoader whose batch size follows the monitor, batch by batch;
- ``lr_scaling``: the learning rate rescaled with the batch size (linear, sqrt, none);
- ``memory_model``: the job's peak memory per batch size, fitted by a line;
- ``oom``: out-of-memory errors recognised, from CUDA, ROCm, MPS or the CPU allocator.
"""
