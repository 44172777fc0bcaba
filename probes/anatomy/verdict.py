"""Why the steps take as long as they do, in words, with the figures and what to try.

The rules, first match wins (shares of the step's training time):

- input-bound: waiting for data ≥ ``INPUT_SHARE``;
- communication-bound: the collective wait ≥ ``COMM_SHARE`` (DDP's all-reduce, FSDP2's
  all-gathers and reduce-scatters);
- host-bound: a GPU busy less than ``HOST_GPU_UTIL`` percent, or time outside data, the model
  and the optimizer ≥ ``HOST_SHARE`` (logging, host syncs, Python between the phases);
- compute-bound: otherwise — the model's own forward, backward and optimizer are the step.

A verdict changes only when the new one has come out of ``SETTLE`` readings in a row, so a
single slow batch does not flip it back and forth.
"""

from __future__ import annotations

from typing import NamedTuple

from ..wire.protocol import StepAnatomy, Verdict
from .seconds import PhaseTotals
from .window import anatomy_of

INPUT_SHARE = 0.20
COMM_SHARE = 0.20
HOST_SHARE = 0.30
HOST_GPU_UTIL = 60.0
MIN_STEPS = 10  # steps split before a first verdict
SETTLE = 3


NO_LOADER = "data: not measured (no DataLoader batch seen); forward includes making the batch"
NO_DDP = "communication: not measured (the model is not DistributedDataParallel)"
DDP_SAMPLED = "communication: DDP's own timing, sampled every 20 steps"
DDP_NOT_YET = "communication: not sampled yet (DDP's own timing comes every 20 steps)"
DDP_UNKNOWN = "communication: not measured (no DDP timing in these steps)"
FSDP2_MEASURED = (
    "communication: FSDP2's all-gathers and reduce-scatters, the time the step waits in them "
    "(with their copies in and out), on the sampled steps"
)
FSDP2_NONE_SEEN = "no FSDP2 collective in these steps"


def anatomy_notes(
    anatomy: StepAnatomy,
    world_size: int,
    ddp: bool | None = None,
    fsdp2: bool | None = None,
    why_not: str | None = None,
) -> list[str]:
    """What the reading does not measure, or how; ``ddp``: whether the job trains a
    DistributedDataParallel (``SessionInfo.ddp``, found by ``distributed.ddp_of``; None: not
    known, a record from before it was kept); ``fsdp2``: whether it is sharded by FSDP2's
    ``fully_shard`` (``SessionInfo.fsdp2``), ``why_not``: why its collectives are not seen."""
    notes = [] if anatomy.data_s is not None else [NO_LOADER]
    if fsdp2:
        if anatomy.comm_s is not None:
            notes.append(FSDP2_MEASURED)
            if anatomy.comm_total_s:
                notes.append(hidden_note(anatomy.comm_s, anatomy.comm_total_s))
        else:
            notes.append(f"communication: not measured ({why_not or FSDP2_NONE_SEEN})")
    elif anatomy.comm_s is not None:
        notes.append(DDP_SAMPLED)
    elif world_size > 1:
        notes.append({True: DDP_NOT_YET, False: NO_DDP, None: DDP_UNKNOWN}[ddp])
    return notes


def hidden_note(exposed_s: float, total_s: float) -> str:
    """How much of FSDP2's collectives hides behind compute: their total less the wait (at
    least that much: the wait includes the copies in and out)."""
    hidden = max(0.0, total_s - exposed_s) / total_s
    return f"collectives: {_ms(total_s)} a step in all, {hidden:.0%} of it hidden behind compute"


class LoaderFacts(NamedTuple):
    """How the job's training DataLoader is set up (for the advice)."""

    workers: int
    pin_memory: bool
    prefetch_factor: int | None


def loader_facts(iterator: object) -> LoaderFacts:
    """What a DataLoader iterator says of its loader's set-up."""
    workers = getattr(iterator, "_num_workers", 0)
    prefetch = getattr(iterator, "_prefetch_factor", None)
    return LoaderFacts(
        workers if isinstance(workers, int) else 0,
        bool(getattr(iterator, "_pin_memory", False)),
        prefetch if isinstance(prefetch, int) else None,
    )


class Judgement(NamedTuple):
    verdict: Verdict
    evidence: str
    advice: str


def share(part: float | None, anatomy: StepAnatomy) -> float:
    step = anatomy.step_s
    return (part or 0.0) / step if step else 0.0


def _ms(seconds: float | None) -> str:
    return f"{(seconds or 0.0) * 1000:.1f} ms"


def judge(
    anatomy: StepAnatomy,
    gpu_util: float | None = None,
    loader: LoaderFacts | None = None,
    fsdp2: bool | None = None,
) -> Judgement | None:
    """The verdict on ``anatomy`` (None: too few steps split yet); ``fsdp2``: the collectives
    are FSDP2's, not DDP's all-reduce."""
    if anatomy.steps < MIN_STEPS or not anatomy.step_s:
        return None
    step = _ms(anatomy.step_s)
    data = share(anatomy.data_s, anatomy)
    if data >= INPUT_SHARE:
        return Judgement(
            "input-bound",
            f"{data:.0%} of each step waits for data ({_ms(anatomy.data_s)} of {step})",
            _input_advice(loader, gpu_util is not None),
        )
    comm = share(anatomy.comm_s, anatomy)
    if comm >= COMM_SHARE:
        return _communication_bound(comm, f"({_ms(anatomy.comm_s)} of {step})", fsdp2)
    other = share(anatomy.other_s, anatomy)
    if gpu_util is not None and gpu_util < HOST_GPU_UTIL:
        return Judgement(
            "host-bound",
            f"the GPU is busy {gpu_util:.0f}% of the time while data waits only {data:.0%}",
            "a larger batch (+); torch.compile or CUDA graphs to launch fewer kernels; "
            "no .item() or .cpu() on every step",
        )
    if other >= HOST_SHARE:
        return Judgement(
            "host-bound",
            f"{other:.0%} of each step is outside data, forward, backward and the optimizer "
            f"({_ms(anatomy.other_s)} of {step})",
            "log and synchronize less often (.item(), .cpu(), printing); "
            "checkpoints and evaluation off the step path",
        )
    model = 1.0 - data - comm - other
    advice = (
        "bf16 autocast or torch.compile for faster kernels; a larger batch if memory allows "
        "(p probes it)"
        if gpu_util is not None
        else "the model's arithmetic is the step: a faster device, or bf16 and torch.compile"
    )
    return Judgement(
        "compute-bound",
        f"forward, backward and the optimizer take {model:.0%} of each step ({step})",
        advice,
    )


def _communication_bound(comm: float, figures: str, fsdp2: bool | None) -> Judgement:
    if fsdp2:
        return Judgement(
            "communication-bound",
            f"{comm:.0%} of each step waits for FSDP2's all-gathers and reduce-scatters {figures}",
            "look for a slow rank (r: ranks); a larger batch per rank to spread each "
            "collective over more examples; fully_shard fewer, larger modules; "
            "reshard_after_forward=False to skip the backward all-gather if memory allows",
        )
    return Judgement(
        "communication-bound",
        f"{comm:.0%} of each step waits for the gradient all-reduce {figures}",
        "look for a slow rank (r: ranks); larger DDP buckets (bucket_cap_mb); "
        "accumulate gradients under no_sync() to all-reduce less often",
    )


def _input_advice(loader: LoaderFacts | None, on_gpu: bool) -> str:
    if loader is None:
        return "prepare batches ahead of the step: a DataLoader with workers (num_workers)"
    tips = []
    if loader.workers == 0:
        tips.append("DataLoader(num_workers=4 or more): batches are made on the training thread")
    else:
        tips.append(f"more DataLoader workers (now {loader.workers}) or a higher prefetch_factor")
    if on_gpu and not loader.pin_memory:
        tips.append("pin_memory=True")
    tips.append("persistent_workers=True; decode and augment once, not every epoch")
    return "; ".join(tips)


def judged(
    totals: PhaseTotals | None,
    world_size: int,
    gpu_util: float | None = None,
    ddp: bool | None = None,
    fsdp2: bool | None = None,
) -> StepAnatomy | None:
    """Recorded phases read as a step anatomy with its notes and the verdict its figures
    give at once (no settling: a record or a summary, not a live reading)."""
    reading = anatomy_of(totals) if totals is not None else None
    if reading is None:
        return None
    reading.notes = anatomy_notes(reading, world_size, ddp, fsdp2)
    judgement = judge(reading, gpu_util, fsdp2=fsdp2)
    if judgement is not None:
        reading.verdict, reading.evidence, reading.advice = judgement
    return reading


class VerdictKeeper:
    """The current verdict, changed only after ``SETTLE`` readings agree on a new one."""

    def __init__(self) -> None:
        self.current: Judgement | None = None
        self._candidate: Verdict | None = None
        self._streak = 0

    def update(self, judgement: Judgement | None) -> bool:
        """Whether the verdict changed with this reading."""
        if judgement is None:
            return False
        if self.current is None:
            self.current = judgement
            return True
        if judgement.verdict == self.current.verdict:
            self.current = judgement  # same verdict, the latest figures
            self._candidate, self._streak = None, 0
            return False
        if judgement.verdict != self._candidate:
            self._candidate, self._streak = judgement.verdict, 0
        self._streak += 1
        if self._streak < SETTLE:
            return False
        self.current = judgement
        self._candidate, self._streak = None, 0
        return True
