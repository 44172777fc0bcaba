"""Every rank on one screen: each rank's summary reaches rank 0 through torch.distributed's
own key-value store (the one the job's process group was set up with).

Every 2 s a bsmon thread on each rank writes its latest summary (a dozen numbers, its host
and local rank) under its own key, and on rank 0 reads the keys that exist. Nothing waits on
another rank: no collective, no blocking receive. A rank that stops answering simply stops
refreshing its key and is shown as late. (Point-to-point over gloo was tried and rejected: a
blocking receive cannot be interrupted — destroying the process group under it aborts the
process — and a timed-out one closes the connection for good.)

Where the model is DistributedDataParallel, its runtime statistics give each rank's forward
and backward compute time and the all-reduce time not hidden behind backward; otherwise the
step anatomy's sampled steps give them (under FSDP2 with the wait in its all-gathers and
reduce-scatters). In synchronous data parallelism every rank's step takes as long as the
slowest one's, so the straggler shows up in its own time (waiting for data, computing), and
the others in waiting for it in the collectives (``straggler``).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import msgspec
import torch
import torch.distributed as dist

from ..wire.protocol import STRAGGLER_FLAG, Metrics, RankReading, RanksReading
from .hot_path import NEVER
from .service import Extension, MetricsPart

SEND_INTERVAL_S = 2.0
VIEW_INTERVAL_S = 1.0
LATE_AFTER_S = 3 * SEND_INTERVAL_S
DDP_SAMPLE_EVERY = 20  # steps between DDP's own timing samples (and our reads of them)
ANATOMY_TIMING = "compute = forward + backward (the step anatomy's sampled steps)"
FSDP2_TIMING = (
    "compute = forward + backward, wait = the time in FSDP2's all-gathers and reduce-scatters "
    "(the step anatomy's sampled steps)"
)

FIELDS = (
    "step",
    "step_time_s",
    "samples_per_s",
    "tokens_per_s",
    "mfu",
    "batch_size",
    "util_percent",
    "memory_used_bytes",
    "memory_total_bytes",
    "forward_s",
    "backward_s",
    "comm_wait_s",
    "data_s",
    "verdict",
    "throttled",
    "sm_clock_mhz",
    "power_w",
)


class DdpTiming:
    """Reads a DDP model's runtime statistics on the training thread every few steps (the
    read is a small C++ call; doing it there avoids racing the reducer)."""

    def __init__(self, model: torch.nn.Module | None) -> None:
        self.model = model if _is_ddp(model) else None
        if self.model is not None:
            self.model._set_ddp_runtime_logging_sample_rate(DDP_SAMPLE_EVERY)
        self.latest: dict[str, float] = {}

    @property
    def reason(self) -> str:
        if self.model is not None:
            return "compute = forward + backward (DDP runtime statistics)"
        return ANATOMY_TIMING

    def comm_wait(self) -> float | None:
        """The all-reduce wait of DDP's latest sampled step (None: none yet, or not DDP)."""
        return self.latest.get("comm_wait_s")

    def at_boundary(self, step: int, _now: float) -> int:
        """Read the statistics of every DDP_SAMPLE_EVERY-th step; the next such step."""
        if self.model is None:
            return NEVER
        self.at_step(step)
        return (step // DDP_SAMPLE_EVERY + 1) * DDP_SAMPLE_EVERY

    def at_step(self, step: int) -> None:
        if self.model is None or step % DDP_SAMPLE_EVERY:
            return
        data = self.model._get_ddp_logging_data()
        forward = data.get("forward_compute_time")
        backward = data.get("backward_compute_time")
        comm = data.get("backward_comm_time")
        overlap = data.get("backward_compute_comm_overlap_time", 0)
        if forward and backward:
            self.latest = {
                "forward_s": forward / 1e9,
                "backward_s": backward / 1e9,
                "comm_wait_s": max(0, (comm or 0) - (overlap or 0)) / 1e9,
            }


def _is_ddp(model: object) -> bool:
    return isinstance(model, torch.nn.parallel.DistributedDataParallel)


class RankExchange:
    """Carries summaries through the job's store, on one daemon thread per rank."""

    def __init__(self, store: Any, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self._store = store
        self._outgoing: bytes | None = None
        self._stop = threading.Event()
        self._decoder = msgspec.json.Decoder()
        self.received: dict[int, tuple[float, dict[str, Any]]] = {}
        self._sequences: dict[int, int] = {}
        self.failure: str | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="bsmon-ranks")
        self._thread.start()

    def offer(self, summary: dict[str, Any]) -> None:
        """The latest summary replaces any not yet written (never blocks)."""
        self._outgoing = msgspec.json.encode(summary)

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(SEND_INTERVAL_S / 2):
            try:
                outgoing, self._outgoing = self._outgoing, None
                if outgoing is not None:
                    self._store.set(f"r{self.rank}", outgoing)
                if self.rank == 0:
                    self._collect()
            except Exception as exc:  # the store went away (the job is ending)
                self.failure = f"{type(exc).__name__}: {exc}"
                return

    def _collect(self) -> None:
        for peer in range(1, self.world_size):
            key = f"r{peer}"
            if not self._store.check([key]):
                continue
            values = self._decoder.decode(self._store.get(key))
            sequence = values.get("seq")
            if sequence != self._sequences.get(peer):  # a new summary: heard from it now
                self._sequences[peer] = sequence
                self.received[peer] = (time.time(), values)


def store_for(serial: int) -> Any:
    """A namespace in the job's rendezvous store for this monitor's summaries."""
    from torch.distributed import distributed_c10d

    return dist.PrefixStore(f"bsmon/ranks/{serial}/", distributed_c10d._get_default_store())


class Straggler(NamedTuple):
    rank: int | None
    ratio: float | None  # its own time over the median rank's
    cause: str | None = None  # what makes it slow, in words (None: nothing stands out)


def straggler(readings: Sequence[RankReading]) -> Straggler:
    """The rank the others wait for: the most time of its own per step (waiting for data and
    computing; waiting in the collectives is waiting for the others), its own time over the
    median rank's, and what makes it slow (``cause_of``)."""
    timed = [r for r in readings if compute_of(r) is not None and not r.late]
    if len(timed) < 2:
        return Straggler(None, None)
    median = statistics.median(map(own_time, timed))
    slowest = max(timed, key=lambda r: (own_time(r), r.rank))
    ratio = own_time(slowest) / median if median > 0 else None
    return Straggler(slowest.rank, ratio, cause_of(slowest, timed, ratio))


def compute_of(rank: RankReading) -> float | None:
    if rank.forward_s is None or rank.backward_s is None:
        return None
    return rank.forward_s + rank.backward_s


def own_time(rank: RankReading) -> float:
    """A rank's time per step that is its own: computing and waiting for its data."""
    return (compute_of(rank) or 0.0) + (rank.data_s or 0.0)


def cause_of(slowest: RankReading, timed: Sequence[RankReading], ratio: float | None) -> str | None:
    """What makes the slowest rank slow, in words: data wait or compute, whichever puts it
    further above the median rank, where its own time stands out (``STRAGGLER_FLAG``); where
    none does and the ranks wait longer in their collectives than they compute, the
    collective wait; else None."""
    compute = statistics.median(compute_of(r) or 0.0 for r in timed)
    data = statistics.median(r.data_s or 0.0 for r in timed)
    if ratio is not None and ratio >= STRAGGLER_FLAG:
        extra_data = (slowest.data_s or 0.0) - data
        if extra_data > (compute_of(slowest) or 0.0) - compute:
            seconds, median, what = slowest.data_s, data, "data wait"
        else:
            seconds, median, what = compute_of(slowest), compute, "compute"
        return (
            f"r{slowest.rank} is slow in {what}: {_ms(seconds)} a step against the median "
            f"rank's {_ms(median)}{_throttling(slowest)}"
        )
    waits = [r.comm_wait_s for r in timed if r.comm_wait_s is not None]
    if len(waits) == len(timed) and (wait := statistics.median(waits)) > max(compute, data):
        return (
            f"no rank stands out: every rank waits {_ms(wait)} a step in its collectives, "
            f"more than it computes ({_ms(compute)}); the collectives themselves are slow"
        )
    return None


def _throttling(rank: RankReading) -> str:
    """The rank's GPU held down by NVML's reasons, with its clock and power, if it is."""
    if rank.throttled is None:
        return ""
    at = [f"{rank.sm_clock_mhz:.0f} MHz" if rank.sm_clock_mhz is not None else None]
    at.append(f"{rank.power_w:.0f} W" if rank.power_w is not None else None)
    figures = ", ".join(x for x in at if x)
    return f"; its GPU is throttled ({rank.throttled}{': ' + figures if figures else ''})"


def _ms(seconds: float | None) -> str:
    return f"{(seconds or 0.0) * 1e3:.1f} ms"


class RanksExtension(Extension):
    """The agent-thread side: every rank builds its summary; rank 0 also builds the view."""

    def __init__(
        self,
        exchange: RankExchange,
        placement: tuple[str, int],
        summary: Callable[[Metrics], dict[str, Any]],
        timing: DdpTiming,
        *,
        fsdp2: bool = False,
    ) -> None:
        self._exchange = exchange
        self._host, self._local_rank = placement
        self._summary = summary
        self._timing = timing
        self._fsdp2 = fsdp2  # the wait is FSDP2's, from the step anatomy
        self._sequence = 0
        self._own: dict[str, Any] = {}
        self._last = 0.0
        self._reading: RanksReading | None = None

    def metrics_part(self, metrics: Metrics) -> MetricsPart:
        """Rank 0's view as of the previous message (each rank's summary is read from a
        finished message, every part in)."""
        return {"ranks": self._reading}

    def on_metrics(self, metrics: Metrics) -> None:
        """Summaries are made every SEND_INTERVAL_S and rank 0's view once a second: the
        agent thread shares the interpreter with the training thread, so it does little."""
        now = time.time()
        interval = VIEW_INTERVAL_S if self._exchange.rank == 0 else SEND_INTERVAL_S
        if now - self._last >= interval:  # the first call always passes (_last is 0)
            self._last = now
            self._sequence += 1
            timing = self._timing
            timed = timing.latest if timing.model is not None else anatomy_timing(metrics)
            self._own = {
                **self._summary(metrics),
                **timed,
                "seq": self._sequence,
                "host": self._host,
                "local_rank": self._local_rank,
            }
            if self._exchange.rank != 0:
                self._exchange.offer(self._own)
            else:
                self._reading = self.reading(now)

    def detach(self) -> None:
        """The exchange's thread stops."""
        self._exchange.close()

    def latest_dict(self) -> dict[str, Any] | None:
        """Rank 0's last view (None elsewhere, or before one is made)."""
        return msgspec.to_builtins(self._reading) if self._reading is not None else None

    def reading(self, now: float) -> RanksReading:
        exchange = self._exchange
        readings = [self._rank_reading(0, self._own, 0.0)]
        for peer in range(1, exchange.world_size):
            heard = exchange.received.get(peer)
            if heard is None:
                readings.append(RankReading(rank=peer, late=True))
                continue
            at, values = heard
            readings.append(self._rank_reading(peer, values, now - at))
        slowest = straggler(readings)
        sizes = [r.batch_size for r in readings if r.batch_size is not None]
        timing = self._timing.reason
        if self._timing.model is None and self._fsdp2:
            timing = FSDP2_TIMING
        return RanksReading(
            world_size=exchange.world_size,
            ranks=readings,
            straggler=slowest.rank,
            straggler_ratio=slowest.ratio,
            straggler_cause=slowest.cause,
            timing=timing,
            global_batch_size=sum(sizes) if len(sizes) == exchange.world_size else None,
        )

    @staticmethod
    def _rank_reading(rank: int, values: dict[str, Any], age: float) -> RankReading:
        fields = {k: values.get(k) for k in FIELDS}
        return RankReading(
            rank=rank,
            host=str(values.get("host", "")),
            local_rank=int(values.get("local_rank", 0)),
            age_s=age,
            late=age > LATE_AFTER_S,
            **fields,
        )


def anatomy_timing(metrics: Metrics) -> dict[str, float | None]:
    """A rank's compute and collective wait from its step anatomy (a job without DDP: FSDP2's
    wait, or none; the anatomy's forward and backward exclude the wait)."""
    anatomy = metrics.anatomy
    if anatomy is None:
        return {}
    return {
        "forward_s": anatomy.forward_s,
        "backward_s": anatomy.backward_s,
        "comm_wait_s": anatomy.comm_s,
    }


def rank_summary(metrics: Metrics) -> dict[str, Any]:
    """This rank's own figures, from the metrics it is about to send to its own monitor."""
    device = max(metrics.devices, key=lambda d: d.memory_used_bytes or 0, default=None)
    anatomy, throughput = metrics.anatomy, metrics.throughput
    return {
        "data_s": anatomy.data_s if anatomy else None,
        "verdict": anatomy.verdict if anatomy else None,
        "step": metrics.step,
        "step_time_s": metrics.step_time_s,
        "samples_per_s": metrics.samples_per_s,
        "tokens_per_s": throughput.tokens_per_s if throughput else None,  # this device's
        "mfu": throughput.mfu if throughput else None,
        "batch_size": metrics.batch_size,
        "util_percent": device.util_percent if device else None,
        "memory_used_bytes": device.memory_used_bytes if device else None,
        "memory_total_bytes": device.memory_total_bytes if device else None,
        "throttled": device.throttled if device else None,
        "sm_clock_mhz": device.sm_clock_mhz if device else None,
        "power_w": device.power_w if device else None,
    }
