"""A trial (agent thread): where B_simple holds a size just short of paying for the next one,
the autopilot tries the next size and keeps it only if the loss shows it paying.

B_simple can read well below the critical batch (the measured signal's module, ``progress``,
says why), and a size it holds is exactly where that matters. Once the size has run long
enough to be a base (``BASE_WINDOWS`` loss windows whose line falls measurably), the next size
predicts at least ``FLOOR``× the progress per second on B_simple's cautious reading, and the
loss is clear enough that a measurement could decide (the interval it would get, narrower than
the speed the size buys), the autopilot grows to it as a trial. The change is measured like
any other: the loss at the new size against the old size's curve carried on. The trial ends
as soon as the measured interval decides (the new size's goodput over the old's, at each end
of the loss's noise scale, above 1 or below it), or once the measurement is final:

- **pays** (at the interval's low end): the size stays, and the floor the loss showed lets
  the advisor go further;
- **loses** (at its high end), or **undecided** when final: back to the old size, and the
  next trial waits until the job's examples have grown ``SPACING``× (the critical batch grows
  with training; a trial a moment later would measure the same thing).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from .goodput import StepTimeModel, efficiency_ratio
from .progress import ProgressMeter, expected_half_width, fit_base

FLOOR = 0.8  # B_simple's predicted gain at which the next size is worth a trial
BASE_WINDOWS = 20  # loss windows at the held size before it is a base for one
SPACING = 2.0  # the job's examples between trials


@dataclass(frozen=True)
class Trial:
    old: int
    new: int
    step: int
    examples: int  # the job's, when it was asked for


@dataclass(frozen=True)
class Outcome:
    pays: bool
    text: str
    gain: float  # the new size's progress per second over the old's, at the measured point


def candidate(
    up: tuple[int | None, float],
    meter: ProgressMeter,
    examples: int,
    last: int | None,
    speed: Callable[[int], float],
) -> int | None:
    """The size to try, given the advisor's best size up and its gain (None: no trial now:
    no size up, too little predicted, no base yet, too soon after the last, or a loss too
    noisy to tell: ``speed(size)``, the size's throughput over the current one's, is what an
    example there may lose before it stops paying, and the interval a measurement would get
    must be narrower than that)."""
    size, gain = up
    if size is None or gain < FLOOR:
        return None
    speed_ratio = speed(size)
    if last is not None and examples < SPACING * last:
        return None
    if len(meter.stretch) < BASE_WINDOWS:
        return None
    base = fit_base(meter.stretch)[0]
    if base is None or expected_half_width(base, examples) > math.log(speed_ratio):
        return None  # the loss could not tell the size paying from not
    return size


def outcome(trial: Trial, meter: ProgressMeter, model: StepTimeModel) -> Outcome | None:
    """The trial's verdict once the measurement decides it or is final (None: measuring)."""
    found = meter.latest
    if found is None or (found.old, found.new) != (trial.old, trial.new):
        return None
    low, high = found.bounds()
    speed = model.speed_ratio(trial.new, trial.old)
    worst = speed * efficiency_ratio(trial.new, trial.old, low)
    best = speed * efficiency_ratio(trial.new, trial.old, high)
    gain = speed * found.efficiency
    measured = (
        f"the loss measured {found.efficiency:.2f}× [{found.low:.2f}, {found.high:.2f}] of "
        f"{trial.old}'s progress per example"
    )
    if worst > 1:
        return Outcome(True, f"{trial.new} pays: {measured}, ≥ {worst:.2f}× a second", gain)
    if best < 1:
        return Outcome(False, f"{trial.new} does not pay: {measured}, ≤ {best:.2f}× a second", gain)
    if found.final:
        return Outcome(False, f"{trial.new} is not measurably paying: {measured}", gain)
    return None
