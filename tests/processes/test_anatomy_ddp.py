"""Step anatomy under DDP: a rank that is slow in its forward pass makes the others wait in
the all-reduce, and their anatomy says so (2 real gloo processes on the CPU)."""

from __future__ import annotations

from bsmon.probes.wire import protocol
from bsmon.probes.wire.client import JobConnection

from ..helpers import ROOT, wait_until

SLOW = 1


def test_the_waiting_rank_is_communication_bound_and_the_ranks_view_shows_it(
    bsmon_dir, processes, tmp_path
):
    init = tmp_path / "init"
    ranks = [
        processes.python(
            str(ROOT / "tests" / "ddp_ranks_worker.py"), str(r), "2", str(init), "--slow",
            str(SLOW), cwd=ROOT,
        )
        for r in range(2)
    ]  # fmt: skip
    socket = bsmon_dir / f"{ranks[0].pid}.sock"
    wait_until(socket.exists, timeout=90, message="rank 0's socket")
    seen: dict[str, protocol.Metrics] = {}

    def rank0_waits_and_the_view_agrees() -> bool:
        for message in conn.messages(0.5):
            if isinstance(message, protocol.Metrics):
                seen["last"] = message
        last = seen.get("last")
        if last is None or last.anatomy is None or last.ranks is None:
            return False
        return (
            last.anatomy.verdict == "communication-bound"
            and len(last.ranks.ranks) == 2
            and last.ranks.ranks[0].verdict == "communication-bound"
        )

    with JobConnection(socket) as conn:
        conn.hello()
        wait_until(
            rank0_waits_and_the_view_agrees, timeout=120, interval=0.1,
            message="rank 0 communication-bound in its anatomy and in the ranks view",
        )  # fmt: skip
    anatomy = seen["last"].anatomy
    assert anatomy.comm_s is not None and anatomy.step_s is not None
    # the slow rank sleeps 30 ms in each forward pass: rank 0 waits that long less whatever
    # its own compute takes beyond the slow rank's (more on a loaded machine: 15 ms was seen)
    assert 0.01 < anatomy.comm_s < 0.2, anatomy
    assert anatomy.comm_s / anatomy.step_s >= 0.2
    assert "sampled every 20 steps" in " ".join(anatomy.notes)
    assert "slow rank" in anatomy.advice
    slow = seen["last"].ranks.ranks[SLOW]
    assert slow.verdict != "communication-bound"  # the straggler itself does not wait
