"""The parts of benchmarks/noise_tracking.py: ``exact`` (the exact B_simple from every
example's gradient), ``transformer`` (the small decoder and its generated language),
``tasks`` (the moving targets), ``tracking`` (a run with checkpoints), ``goals`` (issue 40's
goals and the figures read against them), ``closed`` (the stationary closed forms) and
``cost`` (noise on against off, side by side)."""
