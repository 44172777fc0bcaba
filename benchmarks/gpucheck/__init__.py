"""The GPU check behind ``benchmarks/gpu_check.py``: every GPU path of bsmon, on a real GPU.

- ``checks``: the list of checks, each with its budget and what "pass" means;
- ``runner``: runs one check in a fresh process within its budget (``run`` is that process);
- ``report``: the results as Markdown and JSON (pure; tested without a GPU);
- ``environment``: is there a GPU to check, and what is it;
- one module per check (``*_check``), the processes they start (``jobs``), their models
  (``models``), process handling (``procs``) and the GPU seen from outside (``outside``);
- the probe check's verdict on its searches (``probe_verdict``), and the searches themselves
  (``boundary``).
"""
