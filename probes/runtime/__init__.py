"""The runtime: what runs inside the training job on every step, and the agent thread.

Modules, one job each:

- ``hot_path``: all bsmon does on the training thread per step (the optimizer's hooks, which
  count each ``optimizer.step()`` once, record it, and run the scheduled slow path);
- ``progress``: the step count, and whether the step in progress is an ordinary one;
- ``inbox``: the records the training thread hands to the agent thread;
- ``logged``: ``mon.log``'s values taken as columns, every call's or each name's latest;
- ``losses``: which tensors ``backward()`` saw are the loss (``bsmon run``, a framework's),
  and the loss in what a step returned;
- ``session``: who this process is (the session the protocol and the record describe);
- ``timing``: timing marks (wall clock, or CUDA events on a GPU) for the sampled steps;
- ``samples``: the samples of each step, and the batch size a person would say;
- ``evaluation``: evaluation time inside the loop, kept apart from step time;
- ``forward_watch``, ``loader_watch``, ``mode_watch``, ``call_watch``: the model's forward
  passes, every DataLoader's batches, ``train()``/``eval()`` switches, and torch functions
  wrapped once per process with subscribers;
- ``layer_inputs``: which dims of a layer's input may hold the examples (a 1-D model input's
  count and the noise scale's layers, one rule);
- ``telemetry``: step records in, metrics windows and history points out (agent thread);
- ``steps``: resolved steps as the telemetry hands them on (one, or a run as columns);
- ``window``: the sums of a window of steps (count, time, samples, scalars);
- ``service``: the agent thread — drains the inbox, aggregates, serves the socket;
- ``devices``: GPU and host readings (NVML, the torch allocator, psutil);
- ``memory_pressure``: the allocator's retries and survived OOMs as warnings (agent thread);
- ``fault_guard``: an exception in bsmon's code on the training thread stops there;
- ``context``: what every part of the job is handed (step clock, events, warnings, fault
  guard, session);
- ``signals``: SIGTERM closes the monitors (end line, summary) before the job exits;
- ``interrupts``: Ctrl-C's traceback leaves out bsmon's wrappers (it ends at the user's line);
- ``distributed``: a private gloo group and the step-boundary exchange between ranks;
- ``ranks``: every rank's summary on rank 0, through torch.distributed's store;
- ``audience``: whose words a reason is in (bsmon run's user, or attach()'s author).

Imported by ``agent`` (the composition root) and the other wings inside the job; never by
the dashboard.
"""
