"""Step anatomy: where each training step's time goes — waiting for data, forward, backward,
the optimizer, the collectives' wait and the rest — live, on a random sample of steps, and a
verdict in words.

Modules, one job each:

- ``marks``: the training thread's O(1) signals (DataLoader batches, backward passes, the
  optimizer step) as timing marks: wall clock on a CPU, CUDA events on a GPU;
- ``collectives``: FSDP2's calls that wait for its all-gathers and reduce-scatters, timed
  on the sampled steps only;
- ``sampling``: which steps are timed (one in every 4 to 12, drawn at random, fewer on
  very fast steps);
- ``phases``: one step's marks turned into seconds per phase (agent thread);
- ``seconds``: the types: a step's seconds per phase and their sums (no torch: the record
  holds them);
- ``window``: the last steps' totals and each history interval's;
- ``verdict``: input-, communication-, host- or compute-bound, with evidence and advice;
- ``extension``: the reading and its verdict in each metrics message, an event on change.

Never imports textual or rich.
"""

from __future__ import annotations
