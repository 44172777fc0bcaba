"""Every rank on one screen: 4 real DDP processes (gloo, CPU); rank 0's socket reports all of
them, finds the straggler, and shows a stalled rank as late without hanging."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch.distributed as dist

from bsmon.probes.runtime.ranks import DdpTiming, straggler
from bsmon.probes.wire import discovery, protocol
from bsmon.probes.wire.client import JobConnection
from bsmon.probes.wire.protocol import RankReading

from ..helpers import ROOT, wait_until

WORLD = 4
SLOW = 2


def test_summaries_travel_through_a_store_and_silence_means_late(tmp_path, monkeypatch):
    from bsmon.probes.runtime import ranks as ranks_module
    from bsmon.probes.runtime.ranks import RankExchange, RanksExtension

    monkeypatch.setattr(ranks_module, "SEND_INTERVAL_S", 0.05)
    monkeypatch.setattr(ranks_module, "LATE_AFTER_S", 0.5)
    store = dist.FileStore(str(tmp_path / "store"), 2)
    rank0, rank1 = RankExchange(store, 0, 3), RankExchange(store, 1, 3)
    try:
        rank1.offer({"seq": 1, "host": "node-b", "local_rank": 1, "step": 42, "util_percent": None})
        wait_until(lambda: 1 in rank0.received, message="rank 1's summary")
        view = RanksExtension(rank0, ("node-a", 0), lambda m: {"step": 42}, DdpTiming(None))
        view._own = {"step": 42, "host": "node-a", "local_rank": 0}
        reading = view.reading(time.time())
        first, second, third = reading.ranks
        assert (first.host, second.host, second.local_rank, second.step) == (
            "node-a",
            "node-b",
            1,
            42,
        )
        assert second.util_percent is None and not second.late
        assert third.late and third.age_s is None  # never heard from
        rank1.close()
        time.sleep(0.7)
        assert view.reading(time.time()).ranks[1].late  # silent for too long
    finally:
        rank0.close()
        rank1.close()


def test_the_straggler_is_the_rank_with_the_most_compute():
    readings = [RankReading(rank=r, forward_s=0.01, backward_s=0.02) for r in range(4)]
    readings[2] = RankReading(rank=2, forward_s=0.04, backward_s=0.02)
    readings.append(RankReading(rank=4, forward_s=9.0, backward_s=9.0, late=True))  # ignored
    rank, ratio, _ = straggler(readings)
    assert rank == 2 and ratio == pytest.approx(0.06 / 0.03)
    assert straggler(readings[:1]) == (None, None, None)


def latest_ranks(conn: JobConnection) -> protocol.RanksReading | None:
    ranks = None
    for message in conn.messages(0.5):
        if isinstance(message, protocol.Metrics) and message.ranks is not None:
            ranks = message.ranks
    return ranks


@pytest.mark.slow
def test_rank_zero_sees_every_rank_flags_the_straggler_and_a_stalled_rank(
    bsmon_dir, processes, tmp_path
):
    init = tmp_path / "init"
    ranks = [
        processes.python(
            str(ROOT / "tests" / "ddp_ranks_worker.py"),
            str(r),
            str(WORLD),
            str(init),
            "--slow",
            str(SLOW),
            cwd=ROOT,
        )
        for r in range(WORLD)
    ]
    socket = bsmon_dir / f"{ranks[0].pid}.sock"
    wait_until(  # listed once it serves (the file alone appears before the socket listens)
        lambda: any(job.socket == socket for job in discovery.iter_jobs(bsmon_dir)),
        timeout=90,
        message="rank 0's socket",
    )
    with JobConnection(socket) as conn:
        hello = conn.hello()
        assert hello.session.world_size == WORLD and hello.session.rank == 0
        state = {}

        def all_ranks_with_timing():
            reading = latest_ranks(conn) or state.get("last")
            state["last"] = reading
            return (
                reading is not None
                and len(reading.ranks) == WORLD
                and all(r.forward_s is not None and not r.late for r in reading.ranks)
                and reading.straggler is not None
            )

        wait_until(
            all_ranks_with_timing, timeout=90, interval=0.1, message="all 4 ranks with DDP timing"
        )
        reading = state["last"]
        assert [r.rank for r in reading.ranks] == [0, 1, 2, 3]
        assert all(r.host for r in reading.ranks) and all(r.step for r in reading.ranks)
        assert reading.straggler == SLOW and reading.straggler_ratio > 1.5
        assert reading.global_batch_size == 16 * WORLD

        os.kill(ranks[3].pid, signal.SIGSTOP)  # a rank that stops answering
        try:

            def rank3_late():
                reading = latest_ranks(conn)
                if reading is not None:
                    state["last"] = reading
                return reading is not None and reading.ranks[3].late

            wait_until(rank3_late, timeout=30, interval=0.1, message="rank 3 shown as late")
            reading = state["last"]
            assert not any(r.late for r in reading.ranks[:3])  # the others still answer
            assert conn.request(protocol.Ping(), timeout=5).ok  # rank 0's agent is responsive
        finally:
            os.kill(ranks[3].pid, signal.SIGCONT)
