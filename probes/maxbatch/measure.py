"""The sidecar: rebuild the job's model and optimizer from the recipe, run a few batch sizes,
and report each as a JSON line on stdout, then the result.

On a GPU it first caps its own allocator to the device's free memory less a floor, so it
runs out of memory before the job can. On the CPU the recipe's memory budget plays the
device: the sidecar's peak resident memory above the budget counts as "does not fit".
It stops at the first size that does not fit, and never retries.
"""

from __future__ import annotations

import gc
import math
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import msgspec
import torch

from ..batch.oom import is_out_of_memory
from ..wire.protocol import ProbePoint, ProbeResult, WhatIf
from . import plan
from . import recipe as recipes
from .cpu_memory import PeakRss, cap_allocations

MEASURED_STEPS = 2
GPU_FLOOR_BYTES = 1 << 30
GPU_FLOOR_FRACTION = 0.05


class Reporter:
    """Writes the sidecar's JSON lines: progress, points, and one result."""

    def __init__(self, stream: Any = sys.stdout) -> None:
        self._stream = stream
        self._encoder = msgspec.json.Encoder()

    def _write(self, **message: Any) -> None:
        self._stream.write(self._encoder.encode(message).decode() + "\n")
        self._stream.flush()

    def progress(self, message: str) -> None:
        self._write(type="progress", message=message)

    def point(self, point: ProbePoint) -> None:
        self._write(type="point", point=point)

    def result(self, result: ProbeResult) -> None:
        self._write(type="result", result=result)


class Sidecar:
    def __init__(self, recipe: recipes.Recipe, reporter: Reporter) -> None:
        self.recipe = recipe
        self.out = reporter
        self.device = torch.device(recipe.device)
        self.cuda = self.device.type == "cuda"
        self.budget = self._cap_memory()
        self.model = recipes.load_structure(recipe.model, self.device)
        self.model.train()
        self.optimizer = recipes.build_optimizer(recipe, self.model)
        self.rss = PeakRss()
        torch.backends.cudnn.benchmark = recipe.cudnn_benchmark
        if recipe.threads:
            torch.set_num_threads(recipe.threads)

    def _cap_memory(self) -> int:
        """The bytes this process may use: a cap on its CUDA allocator, or the CPU budget."""
        if not self.cuda:
            if self.recipe.memory_budget is None:
                raise recipes.RecipeError("a probe on the CPU needs a memory budget (bytes)")
            return self.recipe.memory_budget
        free, total = torch.cuda.mem_get_info(self.device)
        floor = max(GPU_FLOOR_BYTES, int(GPU_FLOOR_FRACTION * total))
        usable = free - floor
        if usable <= 0:
            raise recipes.RecipeError(
                f"only {free / 2**30:.1f} GiB free on {self.device}; the probe keeps a "
                f"{floor / 2**30:.1f} GiB floor for the job, so there is no room to probe"
            )
        torch.cuda.set_per_process_memory_fraction(usable / total, self.device)
        return usable

    # -- one step ----------------------------------------------------------------------------

    def _autocast(self, dtype: str | None) -> Any:
        if dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=getattr(torch, dtype))

    def step(self, batch: Any, autocast: str | None, checkpoint: bool = False) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        with self._autocast(autocast):
            if checkpoint:
                loss = self._checkpointed_loss(batch)
            else:
                loss = recipes.compute_loss(self.recipe, self.model, batch)
        loss.backward()
        self.optimizer.step()

    def _checkpointed_loss(self, batch: Any) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint_sequential

        segments = max(1, int(math.sqrt(len(self.model))))  # type: ignore[arg-type]
        output = checkpoint_sequential(self.model, segments, batch[0], use_reentrant=False)
        return self.recipe.loss_fn(output, batch[1])

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def _held(self) -> int:
        """Memory held between steps (the batch's share of a step is peak minus this)."""
        return torch.cuda.memory_allocated(self.device) if self.cuda else self.rss.current()

    def _peak(self, rss: PeakRss | None) -> tuple[int, int | None]:
        if self.cuda:
            return (
                torch.cuda.max_memory_allocated(self.device),
                torch.cuda.max_memory_reserved(self.device),
            )
        return (rss.peak if rss is not None else self.rss.peak), None

    def _release(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()

    # -- one size ----------------------------------------------------------------------------

    def measure(
        self,
        size: int,
        autocast: str | None = None,
        checkpoint: bool = False,
    ) -> ProbePoint:
        recipe = self.recipe
        if not self.cuda:  # fail as out of memory before the job's watchdog must kill us
            cap_allocations(int(plan.CPU_ALLOCATION_CAP * plan.RUNAWAY_FACTOR * self.budget))
        try:
            batch = recipes.move(recipes.tile(recipe.batch, recipe.batch_size, size), self.device)
            self.step(batch, autocast, checkpoint)  # warm-up: allocator, kernels, optimizer state
            self.optimizer.zero_grad(set_to_none=True)
            self._sync()
            static = self._held()
            if self.cuda:
                torch.cuda.reset_peak_memory_stats(self.device)
            with nullcontext() if self.cuda else self.rss as rss:
                start = time.perf_counter()
                for _ in range(MEASURED_STEPS):
                    self.step(batch, autocast, checkpoint)
                self._sync()
                elapsed = (time.perf_counter() - start) / MEASURED_STEPS
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            exc.__traceback__ = None
            self._release()
            return ProbePoint(batch_size=size, fits=False, note="out of memory")
        peak, reserved = self._peak(rss)
        del batch
        self._release()
        over = not self.cuda and peak > self.budget
        return ProbePoint(
            batch_size=size,
            fits=not over,
            peak_bytes=peak,
            static_bytes=static,
            reserved_bytes=reserved,
            step_time_s=elapsed,
            samples_per_s=size / elapsed if elapsed > 0 else None,
            note="over the memory budget" if over else None,
        )

    # -- the probe ---------------------------------------------------------------------------

    def run(self) -> ProbeResult:
        started = time.monotonic()
        recipe = self.recipe
        points: list[ProbePoint] = []
        autocast = recipe.autocast_dtype
        while (size := self._next_size(points)) is not None:
            self.out.progress(
                f"running batch {size} ({len(points) + 1} of at most {plan.MAX_SIZES})"
            )
            point = self.measure(size, autocast)
            points.append(point)
            self.out.point(point)
            if point.step_time_s and point.step_time_s > recipe.step_time_cap_s:
                self.out.progress(f"a step at {size} took {point.step_time_s:.1f} s; stopping")
                break
        budget = recipe.job_budget if self.cuda and recipe.job_budget else self.budget
        job_points = recipe.job_points if self.cuda else []
        predicted, extrapolation, fit = plan.conclude(points, budget, job_points)
        trials = [p for p in points if p.fits]
        confirmation = self.confirm(points, predicted)
        fitting = [p for p in points if p.fits]
        result = ProbeResult(
            status="ok" if fitting else "failed",
            max_batch_size=max((p.batch_size for p in fitting), default=0),
            points=points,
            predicted_max=predicted,
            margin=plan.MARGIN,
            extrapolation=extrapolation,
            budget_bytes=budget,
            device=str(self.device),
            fit_intercept_bytes=fit.intercept if fit else None,
            fit_slope_bytes=fit.slope if fit else None,
            fit_curvature_bytes=fit.curvature if fit and fit.curvature else None,
            confirmed_max=plan.confirmed_max(predicted, points),
            confirmation=confirmation or None,
            error=None if fitting else "not even the job's own batch size fit beside the job",
        )
        if trials and fit:
            result.what_ifs = self.what_ifs(max(trials, key=lambda p: p.batch_size), fit, budget)
        result.duration_s = time.monotonic() - started
        return result

    def confirm(self, points: list[ProbePoint], predicted: int | None) -> str:
        """Run the predicted size once as a full step before it is recommended; what a
        person reads about it (empty: nothing was predicted)."""
        room = None
        if self.cuda:  # the sidecar has only the memory the job leaves it
            room = plan.conclude(points, self.budget)[0]
        target, why = plan.confirmation_target(predicted, points, room, self.recipe.max_batch_size)
        if target is None:
            return why
        largest = max((p for p in points if p.fits), key=lambda p: p.batch_size)
        expected = (largest.step_time_s or 0.0) * target / largest.batch_size
        if expected > self.recipe.step_time_cap_s:
            return (
                f"untested: a step at {target:,} would take about {expected:.0f} s; "
                f"{largest.batch_size:,} is the largest size that ran"
            )
        self.out.progress(f"confirming batch {target:,}: one full step before it is recommended")
        point = self.measure(target, self.recipe.autocast_dtype)
        failure = point.note
        point.confirmation = True
        point.note = f"confirmation: {failure}" if failure else "confirmation"
        points.append(point)
        self.out.point(point)
        if not point.fits:
            return (
                f"untested: the step at {target:,} did not fit ({failure}); "
                f"{largest.batch_size:,} is the largest size that ran"
            )
        return f"confirmed: a full step at {target:,} ran within the budget{why}"

    def _next_size(self, points: list[ProbePoint]) -> int | None:
        recipe = self.recipe
        if recipe.sizes is not None:
            done = len(points) >= len(recipe.sizes) or bool(points and not points[-1].fits)
            return None if done else recipe.sizes[len(points)]
        return plan.next_size(recipe.job_batch_size, points, self.budget, recipe.max_batch_size)

    def what_ifs(self, largest: ProbePoint, fit: plan.MemoryFit, budget: int) -> list[WhatIf]:
        """The usual ways to fit a bigger batch, each measured at the largest size that ran
        and scaled along the fitted line."""
        as_is = fit.largest_within(budget)
        out = [
            WhatIf(
                "as is",
                as_is,
                measured=False,
                note=f"the fitted line, up to {largest.batch_size:,} measured",
            )
        ]
        if not self.cuda:
            note = "measured on a GPU only: resident memory on the CPU never shrinks back"
            out += [
                WhatIf("bf16 autocast", None, measured=False, note=note),
                WhatIf("activation checkpointing", None, measured=False, note=note),
                plan.accumulation_what_if(out[0].max_batch_size),
            ]
            return out
        if self.recipe.autocast_dtype is None:
            out.append(self._what_if("bf16 autocast", largest, fit, budget, autocast="bfloat16"))
        if isinstance(self.model, torch.nn.Sequential) and self.recipe.loss_fn is not None:
            out.append(
                self._what_if(
                    "activation checkpointing",
                    largest,
                    fit,
                    budget,
                    autocast=self.recipe.autocast_dtype,
                    checkpoint=True,
                )
            )
        else:
            out.append(
                WhatIf(
                    "activation checkpointing",
                    None,
                    measured=False,
                    note="measured for nn.Sequential models with a loss_fn",
                )
            )
        out.append(plan.accumulation_what_if(out[0].max_batch_size))
        return out

    def _what_if(
        self, technique: str, largest: ProbePoint, fit: plan.MemoryFit, budget: int, **how: Any
    ) -> WhatIf:
        self.out.progress(f"what if: {technique} at batch {largest.batch_size}")
        try:
            point = self.measure(largest.batch_size, **how)
        except Exception as exc:
            return WhatIf(technique, None, measured=False, note=f"could not run: {exc}")
        if not point.fits or not point.peak_bytes or not largest.peak_bytes:
            return WhatIf(technique, None, measured=True, note="did not fit")
        intercept = fit.intercept
        scale = (point.peak_bytes - intercept) / max(1.0, largest.peak_bytes - intercept)
        size = fit.scaled(scale).largest_within(budget)
        speed = ""
        if point.samples_per_s and largest.samples_per_s:
            speed = f"; {point.samples_per_s / largest.samples_per_s:.2f}× the throughput"
        return WhatIf(
            technique,
            size,
            measured=True,
            note=f"peak {point.peak_bytes / 2**20:.0f} MiB at {largest.batch_size}{speed}",
        )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    reporter = Reporter()
    if len(args) != 1:
        print("usage: python -m bsmon.probes.maxbatch.sidecar RECIPE", file=sys.stderr)
        return 2
    try:
        sidecar = Sidecar(recipes.read(Path(args[0])), reporter)
        result = sidecar.run()
    except recipes.RecipeError as exc:
        result = ProbeResult(status="refused", error=str(exc))
    except Exception as exc:
        result = ProbeResult(status="failed", error=f"{type(exc).__name__}: {exc}")
    reporter.result(result)
    return 0 if result.status == "ok" else 1
