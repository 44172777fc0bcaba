"""The step ring between the training thread and the agent thread: every step written is
taken once, in order, across the array's end; an agent that falls a whole ring behind loses
the oldest steps and counts them."""

from __future__ import annotations

import pytest

from bsmon.probes.runtime.inbox import StepRing


def write(ring: StepRing, step: int) -> None:
    """What the optimizer's post-hook stores, with each field telling its step."""
    slot = step & ring.mask
    ring.ends[slot] = step / 10
    ring.drawn[slot] = step
    ring.first_batch[slot] = step + 1
    ring.examples[slot] = -step
    ring.declared[slot] = 2 * step
    ring.eval_s[slot] = step / 100
    ring.written = step


def test_each_step_is_taken_once_in_order_across_the_end_of_the_arrays():
    ring = StepRing(8)
    assert ring.take() is None
    taken = []
    for last in (3, 8, 13, 13, 21):  # the third take wraps around; the fourth finds nothing
        for step in range(ring.written + 1, last + 1):
            write(ring, step)
        columns = ring.take()
        if columns is None:
            continue
        steps = list(range(columns.first, columns.first + len(columns.ends)))
        assert columns.ends == [s / 10 for s in steps]
        assert columns.drawn == steps and columns.first_batch == [s + 1 for s in steps]
        assert columns.examples == [-s for s in steps]
        assert columns.declared == [2 * s for s in steps]
        assert columns.eval_s == [s / 100 for s in steps]
        taken += steps
    assert taken == list(range(1, 22)) and ring.lost == 0


@pytest.mark.parametrize(("behind", "lost"), [(8, 0), (9, 1), (30, 22)])
def test_an_agent_a_whole_ring_behind_loses_the_oldest_steps_and_counts_them(behind, lost):
    ring = StepRing(8)
    for step in range(1, behind + 1):
        write(ring, step)
    columns = ring.take()
    assert columns is not None and ring.lost == lost
    assert columns.first == lost + 1 and columns.drawn == list(range(lost + 1, behind + 1))


def test_a_ring_is_a_power_of_two():
    with pytest.raises(ValueError, match="power of two"):
        StepRing(12)


def test_a_field_a_step_leaves_alone_reads_as_its_default_on_every_lap():
    """The post-hook writes samples, examples and evaluation time only when a step has them;
    ``take`` puts the defaults back into the slots it read, so a slot reused a lap later
    never shows an older step's values."""
    from bsmon.probes.runtime.samples import NOT_COUNTED

    ring = StepRing(8)
    for step in range(1, 7):  # with every field
        write(ring, step)
    ring.take()
    for step in range(7, 20):  # the ends and declared size only, across two laps
        slot = step & ring.mask
        ring.ends[slot], ring.declared[slot] = step / 10, 4
        ring.written = step
        if step in (12, 19):  # one take wrapped around the end, one not
            columns = ring.take()
            n = len(columns.ends)
            assert columns.drawn == [0] * n and columns.first_batch == [0] * n
            assert columns.examples == [NOT_COUNTED] * n and columns.eval_s == [0.0] * n
            assert columns.declared == [4] * n
