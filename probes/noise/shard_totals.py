"""The sharded estimate's step sums across ranks, through the job's rendezvous store.

A measured step leaves on each rank a few numbers: its shard's |ḡ|², its examples' summed
squared norms and their count (``sharded.ShardedSource``). The estimate needs their sums
over the ranks, one scalar each. They travel the way the ranks view's summaries do
(``runtime/ranks``): a bsmon thread on every rank writes its steps' numbers under its own key
of the job's store; on rank 0 the same thread reads every rank's key, adds up the steps that
every rank measured and writes the totals under one key, which every rank's thread reads back.
Each rank then forms the same estimate from the same totals.

Why the store and not a collective: nothing here can make a rank wait on another. A
collective (even on bsmon's own gloo group, from a thread of its own, with a timeout) needs
every rank to call it, in the same order; a rank that measured a step another skipped, or
that closed its monitor, leaves the others waiting in it, and the job's
``destroy_process_group`` under a pending collective aborts the process. A store operation is
one request to the store's server; a rank that stops writing is simply not heard from, and
the steps it did not report are dropped. The training thread never takes part: records reach
this module on the agent thread, and the totals come back a second or two later.

At close the last second or two of steps would be lost that way (the whole of a short job: a
120-step Lightning job measured every step and got 14 back), so each rank's last tick
``finish``es: it says it is done, rank 0 combines until every rank is done, and each rank
reads back what concerns it, for at most ``FINAL_WAIT_S`` (a rank that never closes costs the
others that much at exit, once). Rank 0 waits for a rank it has not heard from yet too: a job
of a second or less can end before the first exchange, and a busy machine can bring rank 1's
first word after rank 0's last tick began (rank 0 finished alone and came back with nothing).

The ranks must measure the same steps: the controller schedules a sharded source's steps on
a grid of powers of two (``on_grid``), so that ranks whose budgets differ still meet on the
coarser one's steps; and each rank's gap travels with its steps, rank 0 sends back the largest
(``agreed``), and every rank measures no more often than that, so that a rank does not
measure steps another will not (the gap is the budget's or the warm-up's, which each rank
decides from its own timing and from when the totals reach it).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from typing import Any

import msgspec

from .step_record import StepRecord

INTERVAL_S = 0.5  # how often each rank's thread writes and reads
FINAL_WAIT_S = 2.0  # at close: the longest a rank waits for the others' last steps
FINAL_INTERVAL_S = 0.05  # at close: how often it writes and reads meanwhile
KEEP = 2048  # steps kept waiting on either side (a rank long silent loses its oldest)
MISMATCH = "the ranks measured different layers at this step"

_serials = itertools.count()  # every rank attaches in the same order: the same namespaces

# one step of one rank, or its total: step, |ḡ|², Σ|c_i|², unaccounted, examples,
# signature (the measured parameters' elements), problem
Entry = tuple[int, float, float, float, int, int, str | None]


def on_grid(step: int, ahead: int) -> int:
    """Steps from ``step`` to the next one to measure, on a grid all ranks share: the next
    multiple of the smallest power of two at least ``ahead``. Two ranks whose gaps differ meet
    on every step of the coarser grid."""
    size = 1 << max(0, ahead - 1).bit_length()
    return (step // size + 1) * size - step


def store_for() -> Any:
    """A namespace in the job's rendezvous store for the next monitor's step sums."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    serial = next(_serials)
    return dist.PrefixStore(f"bsmon/noise/{serial}/", distributed_c10d._get_default_store())


def _add(entries: list[Entry]) -> Entry:
    """The ranks' parts of one step, summed."""
    step = entries[0][0]
    problem = next((e[6] for e in entries if e[6]), None)
    if len({e[5] for e in entries}) > 1:
        problem = problem or MISMATCH
    return (
        step,
        sum(e[1] for e in entries),
        sum(e[2] for e in entries),
        sum(e[3] for e in entries),
        sum(e[4] for e in entries),
        entries[0][5],
        problem,
    )


class Combiner:
    """Rank 0's bookkeeping: the ranks' entries by step; a step is complete once every rank
    reported it, and dropped once a rank reported a later step without it."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.pending: dict[int, dict[int, Entry]] = {}
        self.latest = [-1] * world_size  # the last step heard from each rank
        self.totals: deque[Entry] = deque(maxlen=KEEP)
        self.dropped = 0

    def add(self, rank: int, entries: list[Entry]) -> None:
        for entry in entries:
            step = entry[0]
            if step > self.latest[rank]:
                self.pending.setdefault(step, {})[rank] = entry
                self.latest[rank] = step
        self._settle()

    def _settle(self) -> None:
        for step in sorted(self.pending):
            parts = self.pending[step]
            if len(parts) == self.world_size:
                self.totals.append(_add([parts[r] for r in range(self.world_size)]))
            elif all(self.latest[r] > step for r in range(self.world_size) if r not in parts):
                self.dropped += 1
            else:
                continue
            del self.pending[step]
        while len(self.pending) > KEEP:
            del self.pending[min(self.pending)]
            self.dropped += 1

    def finish(self) -> None:
        """Every rank is done: a step some rank never reported will not be completed."""
        self.dropped += len(self.pending)
        self.pending.clear()


class ShardTotals:
    """Every rank's side: its records out, the ranks' totals back as records the tracker
    takes (agent thread), the store's traffic on a daemon thread."""

    def __init__(self, store: Any, rank: int, world_size: int, interval: float = INTERVAL_S):
        self.rank = rank
        self.world_size = world_size
        self._store = store
        self._interval = interval
        self._outgoing: deque[Entry] = deque(maxlen=KEEP)  # not yet taken by rank 0
        self._waiting: dict[int, StepRecord] = {}  # this rank's records, by step
        self._arrived: deque[Entry] = deque()  # totals read back, not yet matched
        self._seen = -1  # the last total read back
        self._combiner = Combiner(world_size) if rank == 0 else None
        self._lock = threading.Lock()  # _outgoing: the agent appends, the thread trims
        self._encode = msgspec.json.encode
        self._decode = msgspec.json.Decoder()
        self.failure: str | None = None
        self.gap = 1  # the training thread's own gap to its next measured step (budget's)
        self.agreed = 1  # the largest gap any rank asked for lately (rank 0 says)
        self.unmatched = 0  # steps this rank measured that not every rank did
        self._last_offered = -1
        self._done = False  # closing: nothing more will be offered
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="bsmon-noise-ranks")
        self._thread.start()

    # -- agent thread --------------------------------------------------------------------------

    def offer(self, record: StepRecord, values: list[float], signature: int) -> None:
        """This rank's record of a measured step (its values read): sent to be summed."""
        total, scale, squares, *rest = values
        s2 = scale * scale
        if not s2 > 0:
            s2, problem = 1.0, record.problem or f"loss scale {scale}"
        else:
            problem = record.problem
        unaccounted = rest[0] if record.unaccounted else 0.0
        entry: Entry = (
            record.step,
            total / s2,
            squares / s2,
            unaccounted / s2,
            int(record.examples),
            signature,
            problem,
        )
        if len(self._waiting) >= KEEP:
            del self._waiting[min(self._waiting)]
        self._waiting[record.step] = record
        self._last_offered = record.step
        with self._lock:
            self._outgoing.append(entry)

    def take(self) -> list[tuple[StepRecord, list[float]]]:
        """The steps whose totals came back, in order: records as the tracker reads them —
        |ḡ|², a loss scale of 1, the summed squares and every rank's examples."""
        ready = []
        while self._arrived:
            step, total, squares, unaccounted, examples, _, problem = self._arrived.popleft()
            waiting = self._waiting
            for older in [s for s in waiting if s < step]:
                del waiting[older]
                self.unmatched += 1
            record = waiting.pop(step, None)
            if record is None:
                continue
            units = tuple((examples, size, factor) for _, size, factor in record.units)
            combined = StepRecord(
                step=step,
                estimator=record.estimator,
                values=record.values,  # unread from here on: the totals are the values
                examples=examples,
                units=units,
                unaccounted=record.unaccounted if unaccounted > 0 else (),
                problem=problem,
                gap=record.gap,
            )
            values = [total, 1.0, squares] + ([unaccounted] if combined.unaccounted else [])
            ready.append((combined, values))
        return ready

    def finish(self, wait: float = FINAL_WAIT_S) -> None:
        """At close, after this rank's last ``offer``: exchange at once, not every half
        second, until this rank has its steps' totals back (rank 0: until every rank said it
        is done) or ``wait`` seconds passed. ``take`` then has the last steps."""
        if self._done:
            return
        self._done = True
        self.close()
        self._thread.join(self._interval + 1.0)
        if self._thread.is_alive() or self.failure is not None:
            return  # stuck in the store, or it failed: what came back is all there is
        deadline = time.monotonic() + wait
        while True:
            if self._step() or time.monotonic() >= deadline:
                return
            time.sleep(FINAL_INTERVAL_S)

    def close(self) -> None:
        self._stop.set()

    # -- the thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            if self._step():
                return

    def _step(self) -> bool:
        """One exchange; whether it was the last (finished, or the store failed)."""
        try:
            return self._exchange()
        except Exception as exc:  # the store went away (the job is ending)
            self.failure = f"{type(exc).__name__}: {exc}"
            return True

    def _exchange(self) -> bool:
        """Write this rank's entries, combine (rank 0), read the totals back; whether this
        rank, done, has nothing more to wait for."""
        store = self._store
        with self._lock:
            outgoing = list(self._outgoing)
        mine = {"entries": outgoing, "seen": self._seen, "gap": self.gap, "done": self._done}
        store.set(f"r{self.rank}", self._encode(mine))
        everyone_done = self._combine() if self._combiner is not None else False
        if not store.check(["totals"]):
            return everyone_done
        message = self._decode.decode(store.get("totals"))
        taken = message["taken"][self.rank]
        self.agreed = message["gap"]
        with self._lock:
            while self._outgoing and self._outgoing[0][0] <= taken:
                self._outgoing.popleft()
        fresh = [tuple(t) for t in message["totals"] if t[0] > self._seen]
        if fresh:
            self._seen = fresh[-1][0]
            self._arrived.extend(fresh)  # type: ignore[arg-type]
        if self._combiner is not None:
            return everyone_done
        return self._done and (message.get("final", False) or self._seen >= self._last_offered)

    def _combine(self) -> bool:
        """Rank 0: every rank's entries in, the complete steps' totals out; totals every
        rank has read back are not written again. Whether every rank is done (the
        totals then are final: what is pending stays incomplete)."""
        combiner, store = self._combiner, self._store
        assert combiner is not None
        seen, gaps, done = [], [1], self._done
        for peer in range(self.world_size):
            key = f"r{peer}"
            if not store.check([key]):
                seen.append(-1)
                done = False  # not heard from yet: waited for at close, up to the deadline
                continue
            message = self._decode.decode(store.get(key))
            combiner.add(peer, [tuple(e) for e in message["entries"]])  # type: ignore[misc]
            seen.append(message["seen"])
            gaps.append(message["gap"])
            done = done and message.get("done", False)
        if done:
            combiner.finish()
        everyone = min(seen)
        while combiner.totals and combiner.totals[0][0] <= everyone:
            combiner.totals.popleft()
        payload = {
            "taken": combiner.latest,
            "totals": list(combiner.totals),
            "gap": max(gaps),
            "final": done,
        }
        store.set("totals", self._encode(payload))
        return done
