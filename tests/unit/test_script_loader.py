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


def test_between_epochs_a_change_waits_for_the_next_epoch_and_cuts_it_whole():
    data = TensorDataset(torch.arange(40))
    loader = DataLoader(data, batch_size=8, shuffle=True, generator=torch.Generator())
    running: list = [iter(loader)]
    control = ScriptLoader(lambda: running[0], None, None)
    control.remember(running[0])
    first = [batch[0].tolist() for batch in running[0]]
    running[0] = None  # the epoch's iterator is gone: the script evaluates
    assert control.refusal(16) is None
    assert control.waits_for() == "from the next epoch's first batch (between epochs)"
    applied: list[str] = []
    control.epoch_starts = lambda: applied.append(control.resize(16))
    second = [batch[0].tolist() for batch in loader]
    assert applied == ["from the first batch of the epoch it starts now"]
    assert [len(b) for b in first] == [8] * 5 and [len(b) for b in second] == [16, 16, 8]
    assert sorted(i for batch in second for i in batch) == list(range(40))
    third = [batch[0].tolist() for batch in loader]  # the watch is gone: nothing applied again
    assert len(applied) == 1 and [len(b) for b in third] == [16, 16, 8]
