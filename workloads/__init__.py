"""Training jobs, and what drives them, that both the tests and the benchmarks run (so that
neither tree imports the other's modules):

- ``noise_jobs``: linear regressions whose simple noise scale is known in closed form (the
  noise-scale tests, ``benchmarks/noise_accuracy.py``);
- ``reliability_job``: a real training loop run as a process, reporting its own speed;
- ``reliability_kit``: driving it and the processes that disturb it (the reliability tests,
  ``benchmarks/reliability.py``).

Not installed: the tests find it on pytest's path (the repository root), a benchmark script
puts the root on ``sys.path`` first.
"""
