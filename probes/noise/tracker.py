"""The agent thread's side: step records in, a ``NoiseScaleReading`` out.

Reads each record's values once its device copy has landed (in order), divides out the loss
scale, skips (and counts) steps that cannot be used — non-finite gradients, a problem the
training thread flagged, a gradient that arrived without its per-example hook — forms the
step's unbiased |G|² and tr Σ and feeds the smoother; the reading carries the smoothed
ratio forward to the latest measured step where B_simple is seen to grow (growth.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..runtime.timing import finite_or_none as _finite
from ..wire.protocol import NoiseScaleReading
from .drift import DriftFollowingRatio
from .estimators import EstimateError, Units, components, finite
from .growth import Growth, GrowthCorrection, effective_step
from .smoothing import Estimate
from .step_record import StepRecord

NONFINITE = "non-finite gradients (e.g. a mixed-precision overflow)"
NEGATIVE_G2 = (
    "the averaged |G|² is negative: the update between the two steps of each pair makes "
    "their gradients disagree (a learning rate near its best does that); per_example or "
    "microbatch measure |G|² without that bias"
)
UNACCOUNTED = "a measured parameter got gradient outside its layer's forward"
STALE = 1.25  # a reading this many times past the step its averages stand for says so
BELOW_ZERO = (
    "the averaged |G|² reads below zero beyond its error: the small batches' gradients are "
    "not independent draws of the step's"
)


@dataclass
class Outcome:
    """What one record did: used, or skipped for ``reason``; parameters to stop measuring."""

    used: bool
    reason: str | None = None
    exclude: tuple[int, ...] = field(default_factory=tuple)


class Tracker:
    def __init__(self, window: int) -> None:
        self.averages = DriftFollowingRatio(window)
        self.growth = GrowthCorrection()
        self.growth_applied: Growth | None = None  # at the latest reading
        self.skipped = 0
        self.note: str | None = None
        self.last_step = 0
        self.last_used = 0  # the latest step the averages took in

    def reset(self) -> None:
        self.averages.reset()
        self.growth.reset()
        self.note = None

    def add(self, record: StepRecord, values: list[float]) -> Outcome:
        self.last_step = record.step
        outcome = self._evaluate(record, values)
        if outcome.used:
            self.note = None
        else:
            self.skipped += 1
            self.note = outcome.reason
        return outcome

    def _evaluate(self, record: StepRecord, values: list[float]) -> Outcome:
        if not finite(*values):
            return Outcome(False, NONFINITE)
        if record.problem:
            return Outcome(False, record.problem)
        total, scale, *rest = values
        if record.unaccounted and rest.pop() > 0:
            return Outcome(False, UNACCOUNTED, record.unaccounted)
        s2 = scale * scale
        if not s2 > 0:
            return Outcome(False, f"loss scale {scale}")
        groups = [
            Units(value * factor / s2, count, size)
            for value, (count, size, factor) in zip(rest, record.units, strict=True)
        ]
        try:
            step = components(total / s2, record.examples, groups)
        except EstimateError as exc:
            return Outcome(False, str(exc))
        if not (math.isfinite(step.g2) and math.isfinite(step.trace)):
            return Outcome(False, NONFINITE)
        averages = self.averages
        averages.update(step.g2, step.trace, record.gap, at=record.step)
        self.last_used = record.step
        self.growth.observe(record.step, averages)
        return Outcome(True)

    def reading(
        self,
        estimator: str | None,
        coverage: float | None,
        biased: bool,
        preconditioned: bool,
        detail: str | None,
        *,
        negative: str = BELOW_ZERO,
        now: int | None = None,
    ) -> NoiseScaleReading:
        """The reading at training step ``now`` (the latest measured step when None);
        ``negative``: why an unbiased estimator's |G|² can read below zero beyond its error
        (the source knows: BatchNorm, for per-example norms)."""
        at = max(now or 0, self.last_used)
        est, self.growth_applied = self.growth.apply(at, self.averages, self.last_used)
        if self.growth_applied is None and est.b_simple is not None:
            stands_for = effective_step(self.averages, self.last_used)
            if at >= STALE * stands_for:
                detail = (
                    f"{detail}; the averages stand for about step {stands_for:,.0f} (measured "
                    f"last at step {self.last_used:,}): the interval widened for what training "
                    "may have moved it since"
                )
        return NoiseScaleReading(
            b_simple=_finite(est.b_simple),
            stderr=_finite(est.stderr),
            estimator=estimator,
            coverage=coverage,
            biased=biased,
            lower_bound=_finite(est.lower_bound),
            samples=est.steps,
            skipped_steps=self.skipped,
            ci_low=_finite(est.ci_low),
            ci_high=_finite(est.ci_high),
            needed=math.ceil(est.needed),
            effective=round(est.effective_steps, 1),
            preconditioned=preconditioned,
            detail=detail or None,
            note=self._note(est, biased, negative),
        )

    def _note(self, est: Estimate, biased: bool, negative: str) -> str | None:
        """Why the last step was skipped; or why there is no estimate once enough steps have
        been seen: for the biased pairing of consecutive steps, |G|² at or below zero; for
        the others, |G|² below zero beyond its error (no lower bound either)."""
        if self.note is not None:
            return self.note
        enough = est.effective_steps >= est.needed
        if not enough or est.b_simple is not None or est.g2 is None:
            return None
        if biased and est.g2 <= 0:
            return NEGATIVE_G2
        if not biased and est.lower_bound is None and est.g2 < 0:
            return negative
        return None
