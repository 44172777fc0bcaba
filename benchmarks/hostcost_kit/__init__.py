"""What ``benchmarks/hostcost.py`` runs and reads, one job a module:

- ``setups``: the training step measured and the configurations set up around it;
- ``counting``: the Python calls a configuration adds to a step (cProfile, training thread);
- ``timing``: the microseconds it adds (blocks less the bare blocks either side, in rounds);
- ``goals``: issue 22's goals, each a ratio to a floor with its bootstrap interval.
"""
