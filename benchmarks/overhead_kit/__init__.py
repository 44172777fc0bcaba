"""What ``benchmarks/overhead.py`` runs and reads, one job a module:

- ``models``: the MLP, the CNN and the transformer block, and one training step of each;
- ``blocks``: timed blocks of steps in rotated rounds, and their medians and paired ratios;
- ``agent``: part 1, the agent (and the monitor process that reads it);
- ``noise``: part 2, the noise scale against the agent alone and the floor;
- ``compare``: part 3, W&B and TensorBoard in the same loop (``--compare``).
"""
