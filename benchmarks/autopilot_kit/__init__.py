"""What ``benchmarks/autopilot.py`` runs and reads, one job a module:

- ``tasks``: the two tasks (T1 synthetic classification, T2 a character model of the
  standard library's sources), their data, models and settings;
- ``training``: one run of an arm (fixed, warm-up, fastest ramp or the autopilot) to a target;
- ``lag``: the live noise scale against the exact one (``--lag``);
- ``costs``: this machine's step time per batch size, and the autopilot's own cost (``--cost``);
- ``outcomes``: a run reduced to where it reached each target, an arm over the seeds (pure);
- ``verdicts``: the goals and the printed tables (pure);
- ``protocol``: the tuning and the evaluation of research/autopilot.md §7, run arm by arm.

``outcomes``, ``verdicts`` and ``protocol`` import neither torch nor bsmon at import time:
tests/unit/test_autopilot_benchmark.py reads them without training.
"""
