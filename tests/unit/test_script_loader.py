"""The script's own DataLoader resized in process (the socket path is in
tests/processes/test_resizable.py): two changes within one epoch, every sample once."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from bsmon.probes.batch.script_loader import ScriptLoader


def test_two_changes_in_one_epoch_cut_every_sample_once():
    data = TensorDataset(torch.arange(100))
    generator = torch.Generator().manual_seed(0)
    loader = DataLoader(data, batch_size=8, shuffle=True, generator=generator)
    iterator = iter(loader)
    control = ScriptLoader(lambda: iterator, None, None)
    batches = [next(iterator)[0].tolist() for _ in range(2)]
    assert control.refusal(16) is None
    control.resize(16)
    batches += [next(iterator)[0].tolist() for _ in range(2)]
    assert control.refusal(4) is None  # cut by bsmon now: still resizable
    control.resize(4)
    batches += [batch[0].tolist() for batch in iterator]
    sizes = [len(batch) for batch in batches]
    assert sizes[:4] == [8, 8, 16, 16] and set(sizes[4:]) == {4}  # 100 = 2×8 + 2×16 + 13×4
    assert sorted(i for batch in batches for i in batch) == list(range(100))
    assert loader.batch_size == 4 and len(loader) == 25
