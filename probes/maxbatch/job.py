"""What the job contributes to a probe: the batch it used, the precision it runs in, and the
recipe built from them. Lives in the job; hooks here do O(1) work."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psutil
import torch

from ..batch.advisor import Advisor
from ..batch.control import BatchController
from ..batch.footprint import sharded_parameters
from ..runtime.forward_watch import ForwardWatch, RootPass
from ..wire.protocol import ProbeResult, Recommendation
from . import recipe as recipes
from .seen_step import SeenStep

PRECISION = "the probe: the job's precision"
CPU_BUDGET_CAP = 1 << 30  # default CPU budget: 25% of available memory, at most 1 GiB
SHARDED = (
    "the probe cannot model a sharded job (FSDP2: its parameters are DTensors): its sidecar, "
    "outside the job's process group, could only rebuild the model whole and would measure "
    "another job's memory; step up with + instead: batch control's memory model, fitted per "
    "rank from each size the job runs, asks first where a size may not fit"
)


class ProbeSource:
    """Keeps what a probe needs from the running job (training thread: O(1) per batch)."""

    def __init__(
        self,
        model: torch.nn.Module | None,
        optimizer: torch.optim.Optimizer,
        loss_fn: Any,
        probe_step: Callable[[torch.nn.Module, Any], torch.Tensor] | None,
        control: BatchController | None,
        *,
        watch: ForwardWatch,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.probe_step = probe_step
        self.control = control
        self.batch: Any = None
        self.budget_note: str | None = None  # how the last recipe's budget was chosen
        self.why_not: str | None = None  # why the job cannot be probed (bsmon run's own words)
        self.batch_size = 0
        self.batch_numel = 0
        self.autocast_dtype: str | None = None
        params = [p for group in optimizer.param_groups for p in group["params"]]
        self.sharded = sharded_parameters(
            [*params, *(model.parameters() if model is not None else ())]
        )
        self._watch = watch
        watch.on_root(self._observe_precision)
        watch.hold(PRECISION)  # until one training pass has been seen

    def close(self) -> None:
        self._watch.release(PRECISION)
        self._watch.off_root(self._observe_precision)

    def offer(self, batch: Any, size: int) -> None:
        """A batch the job used: kept when it is the largest so far (by samples, then size)."""
        if size < self.batch_size:
            return
        numel = recipes.batch_numel(batch)
        if size > self.batch_size or numel > self.batch_numel:
            self.batch, self.batch_size, self.batch_numel = batch, size, numel

    def _observe_precision(self, root_pass: RootPass, _output: Any) -> None:
        """After a training pass of the model (the autocast state wraps the whole call)."""
        if not root_pass.grad:
            return
        device_type = "cuda" if torch.cuda.is_initialized() else "cpu"  # initialised: available
        if torch.is_autocast_enabled(device_type):
            self.autocast_dtype = str(torch.get_autocast_dtype(device_type)).removeprefix("torch.")
        else:
            self.autocast_dtype = None
        self._watch.release(PRECISION)

    # -- the recipe (the probe's thread) -------------------------------------------------------

    def use_seen(self, seen: SeenStep) -> None:
        """What a step seen under ``bsmon run`` gives the probe (training thread, once)."""
        self.why_not = seen.why_not
        if seen.why_not is None:
            self.probe_step, self.loss_fn = seen.probe_step, seen.loss_fn
            self.batch, self.batch_size = seen.batch, seen.size
            self.batch_numel = recipes.batch_numel(seen.batch)

    def check(self) -> None:
        if self.sharded:
            raise recipes.RecipeError(SHARDED)
        if self.why_not is not None:
            raise recipes.RecipeError(self.why_not)
        if self.model is None:
            raise recipes.RecipeError("the probe needs the model: attach(model, optimizer, ...)")
        if self.control is None:
            raise recipes.RecipeError("the probe needs attach(..., batch_size=N)")
        if self.batch is None:
            raise recipes.RecipeError(
                "the probe needs a batch the job has used: train with "
                "mon.dataloader(...) or call mon.set_probe_batch(batch)"
            )
        if self.probe_step is None and self.loss_fn is None and not isinstance(self.batch, dict):
            raise recipes.RecipeError(
                "the probe needs attach(..., loss_fn=...) or "
                "attach(..., probe_step=fn(model, batch) -> loss)"
            )

    def recipe(self, memory_budget: int | None) -> recipes.Recipe:
        self.check()
        model, control = self.model, self.control
        assert model is not None and control is not None
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        cls, kwargs, groups = recipes.optimizer_spec(self.optimizer, model)
        self.budget_note = "as asked" if memory_budget is not None else None
        if device.type == "cpu" and memory_budget is None:
            memory_budget, self.budget_note = default_cpu_budget()
        return recipes.Recipe(
            model=recipes.pickle_structure(model),
            optimizer_class=cls,
            optimizer_kwargs=kwargs,
            param_groups=groups,
            batch=recipes.to_cpu(self.batch),
            batch_size=self.batch_size,
            device=str(device),
            job_batch_size=control.loader_size,
            loss_fn=self.loss_fn,
            probe_step=self.probe_step,
            autocast_dtype=self.autocast_dtype,
            cudnn_benchmark=torch.backends.cudnn.benchmark,
            memory_budget=memory_budget,
            max_batch_size=control.policy.max_size,
            job_points=[(p.batch_size, p.peak_bytes) for p in control.memory.points()],
            job_budget=control.memory_budget,
            threads=torch.get_num_threads(),
        )

    def conclude(self, result: ProbeResult, advisor: Advisor | None) -> None:
        """Tell batch control the largest size that fits, and give the probe's step times to
        the advisor, whose answer is then the probe's recommendation."""
        control = self.control
        if control is None or result.status != "ok":
            return
        # a size that ran a full step in the sidecar, never an untested extrapolation
        memory_max = result.confirmed_max or result.max_batch_size or None
        if memory_max is not None and control.policy.max_size is not None:
            memory_max = min(memory_max, control.policy.max_size)
        control.probe_max = memory_max
        shared = result.device == "cpu"
        if advisor is not None:
            advisor.learn_probe(
                [(p.batch_size, p.step_time_s) for p in result.points if p.fits and p.step_time_s]
            )
            advice = advisor.advise()
            result.recommendation = Recommendation(
                batch_size=advice.batch_size,
                reasons=list(advice.reasons),
                current=advice.current,
                confidence=advice.confidence,
                would_change=advice.would_change,
            )
            if (result.confirmation or "").startswith("untested"):
                result.recommendation.reasons.append(f"the prediction is {result.confirmation}")
        result.budget_note = result.budget_note or self.budget_note
        if shared:
            result.notes.append(shared_cores_note(result, control))


def default_cpu_budget() -> tuple[int, str]:
    """The CPU probe's budget (25% of the available memory, at most 1 GiB) and why."""
    available = psutil.virtual_memory().available
    budget = min(CPU_BUDGET_CAP, available // 4)
    capped = ", capped at 1 GiB" if budget == CPU_BUDGET_CAP else ""
    return budget, (
        f"25% of the {available / 2**30:.1f} GiB available{capped} "
        "(bsmon probe --memory-budget, or mon.probe(memory_budget=...), sets another)"
    )


def shared_cores_note(result: ProbeResult, control: BatchController) -> str:
    """The CPU sidecar ran beside the job on the same cores: its throughput is skewed."""
    size = control.loader_size
    probe = next((p.samples_per_s for p in result.points if p.batch_size == size), None)
    job = control.watch.sizes.get(size)
    compared = ""
    if probe and job is not None and job.mean:
        compared = (
            f" (at {size}: {probe:,.0f} samples/s in the sidecar, {job.mean:,.0f} in the job)"
        )
    return (
        "the sidecar ran on the CPU cores the job was using, so its samples/s are lower than "
        f"the job's{compared} and the speed part of the recommendation is a rough guide"
    )


def device_free(device: torch.device) -> tuple[int, int] | None:
    """(free, total) bytes of a CUDA device; reading it does not synchronise the device."""
    if device.type != "cuda":
        return None
    return torch.cuda.mem_get_info(device)
