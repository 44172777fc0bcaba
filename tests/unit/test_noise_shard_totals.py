"""The sharded estimate's sums across ranks (probes/noise/shard_totals.py): the shared grid of
measured steps, rank 0's bookkeeping, two ranks' exchanges through an in-memory store; and
HSDP's replicated shards counted once (probes/noise/sharded.py)."""

from __future__ import annotations

import threading
import time

import torch

from bsmon.probes.noise.shard_totals import MISMATCH, Combiner, ShardTotals, on_grid
from bsmon.probes.noise.sharded import replicas_of
from bsmon.probes.noise.step_record import StepRecord


def measured_steps(gaps: list[int], until: int) -> set[int]:
    """The steps a rank measures when its budget asks for ``gaps`` in turn (then the last)."""
    step, steps, i = 0, set(), 0
    while step < until:
        step += on_grid(step, gaps[min(i, len(gaps) - 1)])
        steps.add(step)
        i += 1
    return steps


def test_ranks_whose_budgets_differ_meet_on_the_coarser_grid():
    assert on_grid(5, 1) == 1
    assert on_grid(5, 3) == 3  # 8: the next multiple of 4
    assert on_grid(8, 4) == 4
    fine, coarse = measured_steps([3], 200), measured_steps([7], 200)
    assert coarse <= fine  # every step the sparser rank measures, the other does too
    wobbling = measured_steps([2, 3, 4, 2, 4], 200)
    assert {s for s in coarse if s > 16} <= wobbling


def entry(step: int, y: float, rank_examples: int = 4, signature: int = 10, problem=None):
    return (step, y, 2 * y, 0.0, rank_examples, signature, problem)


def test_a_step_every_rank_reported_is_summed_and_one_a_rank_skipped_is_dropped():
    combiner = Combiner(2)
    combiner.add(0, [entry(2, 1.0), entry(4, 1.0)])
    assert not combiner.totals  # rank 1 has not spoken
    combiner.add(1, [entry(4, 3.0)])  # rank 1 skipped step 2
    assert list(combiner.totals) == [(4, 4.0, 8.0, 0.0, 8, 10, None)]
    assert combiner.dropped == 1 and not combiner.pending
    combiner.add(0, [entry(6, 1.0, signature=10)])
    combiner.add(1, [entry(6, 1.0, signature=12)])
    assert combiner.totals[-1][6] == MISMATCH  # the ranks measured different layers


class MemoryStore:
    """The job's store as bsmon uses it: set, get, check."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    def set(self, key: str, value: bytes) -> None:
        self.values[key] = value

    def get(self, key: str) -> bytes:
        return self.values[key]

    def check(self, keys: list[str]) -> bool:
        return all(k in self.values for k in keys)


def record(step: int) -> StepRecord:
    return StepRecord(step, "sharded", torch.zeros(3), 4, ((4, 1.0, 0.25),), gap=2)


def test_two_ranks_get_the_same_totals_back_and_agree_on_the_gap():
    store = MemoryStore()
    ranks = [ShardTotals(store, rank, 2, interval=3600) for rank in range(2)]
    try:
        for rank, totals in enumerate(ranks):
            for step in (2, 4):
                totals.offer(record(step), [1.0 + rank, 2.0, 4.0 * (1 + rank)], signature=10)
        ranks[1].offer(record(6), [1.0, 1.0, 1.0], signature=10)  # rank 0 skipped step 6
        ranks[0].offer(record(8), [1.0, 1.0, 1.0], signature=10)
        ranks[1].offer(record(8), [1.0, 1.0, 1.0], signature=10)
        ranks[0].gap, ranks[1].gap = 2, 8  # what each one's budget asks for
        for _ in range(2):  # rank 1 writes, rank 0 combines; both read back
            ranks[1]._exchange()
            ranks[0]._exchange()
            ranks[1]._exchange()
        taken = [totals.take() for totals in ranks]
        assert [[r.step for r, _ in t] for t in taken] == [[2, 4, 8], [2, 4, 8]]
        for t in taken:
            first, values = t[0]
            # the loss scale (2) divided out on each rank before the sums: (1 + 2) / 4
            assert values == [0.75, 1.0, 3.0]
            assert first.examples == 8 and first.units == ((8, 1.0, 0.25),) and first.gap == 2
        assert ranks[1].unmatched == 1  # its step 6: rank 0 did not measure it
        assert not ranks[0]._outgoing  # what rank 0 took is not written again
        assert [totals.agreed for totals in ranks] == [8, 8]  # both follow the sparser
    finally:
        for totals in ranks:
            totals.close()


class Placement:
    def __init__(self, replicate: bool) -> None:
        self.replicate = replicate

    def is_replicate(self) -> bool:
        return self.replicate


class Mesh:
    def __init__(self, *sizes: int) -> None:
        self.sizes = sizes

    def size(self, dim: int) -> int:
        return self.sizes[dim]


def test_hsdp_counts_each_shard_once_however_many_replicas_hold_it():
    """fully_shard on a (replicate 3, shard 2) mesh: every shard's squared norm is on 3 ranks."""
    hsdp = torch.zeros(4)
    hsdp.placements, hsdp.device_mesh = (Placement(True), Placement(False)), Mesh(3, 2)
    assert replicas_of([hsdp]) == 3
    fsdp = torch.zeros(4)
    fsdp.placements, fsdp.device_mesh = (Placement(False),), Mesh(2)
    assert replicas_of([fsdp]) == 1
    assert replicas_of([torch.zeros(4)]) == 1  # not a DTensor


def test_at_close_the_last_steps_totals_come_back_to_every_rank():
    """The exchange threads run an hour apart: after one exchange each (both ranks heard
    from), everything the ranks measured since comes back in ``finish``, run by both ranks at
    once as they close."""
    store = MemoryStore()
    ranks = [ShardTotals(store, rank, 2, interval=3600) for rank in range(2)]
    for totals in ranks:
        totals._exchange()
    for totals in ranks:
        for step in (2, 4, 6):
            totals.offer(record(step), [1.0, 1.0, 1.0], signature=10)
    ranks[1].offer(record(8), [1.0, 1.0, 1.0], signature=10)  # rank 0 never measured it
    closing = [threading.Thread(target=totals.finish, args=(600,)) for totals in ranks]
    for thread in closing:
        thread.start()
    for thread in closing:
        thread.join(600)
    assert not any(thread.is_alive() for thread in closing)
    for totals in ranks:
        assert [r.step for r, _ in totals.take()] == [2, 4, 6]
    assert ranks[0]._combiner.dropped == 1  # step 8: incomplete, and it never will be


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def set(self, key: str, value: bytes) -> None:
        self.writes += 1
        super().set(key, value)


def test_at_close_rank_0_waits_for_a_rank_it_never_heard_from_up_to_the_deadline():
    store = CountingStore()
    alone = ShardTotals(store, 0, 2, interval=3600)
    alone.offer(record(2), [1.0, 1.0, 1.0], signature=10)
    alone.finish(wait=0.3)
    assert store.writes > 2  # not one exchange and out: it kept asking until the deadline
    assert alone.take() == []  # rank 1 never spoke: no step is complete


def test_a_rank_first_heard_from_after_rank_0_began_closing_is_still_summed():
    """A job of under a second ends before the first exchange; on a busy machine rank 1's
    first word can come after rank 0's last tick began (CI: rank 0 finished alone, with no
    step back, and the job had no estimate)."""
    store = MemoryStore()
    ranks = [ShardTotals(store, rank, 2, interval=3600) for rank in range(2)]
    for totals in ranks:
        for step in (2, 4, 6):
            totals.offer(record(step), [1.0, 1.0, 1.0], signature=10)
    first = threading.Thread(target=ranks[0].finish, args=(600,))
    first.start()
    deadline = time.monotonic() + 600
    while not store.check(["totals"]) and time.monotonic() < deadline:
        time.sleep(0.01)  # rank 0 has combined alone at least once
    ranks[1].finish(600)
    first.join(600)
    assert not first.is_alive()
    for totals in ranks:
        assert [r.step for r, _ in totals.take()] == [2, 4, 6]
