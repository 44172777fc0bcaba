"""Why the autopilot keeps the size it has: the walk over the sizes a key press could reach
from the current one, with the rule that ends it, and the rule a look that holds names
(``Hold``: said once per change of rule as an event, and short on the Batch panel)."""

from __future__ import annotations

from typing import NamedTuple

from ..units import count
from .control import BatchController
from .goodput import StepTimeModel
from .verdict import MIN_WINDOWS as VERDICT_WINDOWS

THRESHOLD = 1.05  # predicted gain that makes a change (AdaptDL's: re-choosing every time flaps)
MAX_CANDIDATES = 64  # sizes looked at each way (an additive batch_step of 1 has many)


class Hold(NamedTuple):
    """Why a look kept the size: the rule (said once per change), in words, and short."""

    rule: str
    text: str
    short: str  # the Batch panel's line: 24 columns at 80×24


def candidates(
    control: BatchController,
    current: int,
    direction: str,
    *,
    start_size: int,
    out_of_reach: int | None,
) -> tuple[list[int], Hold | None]:
    """Sizes within 2× of ``current`` in one direction that the policy allows, that fit,
    and not below the size the run started at (every size a key press could reach,
    walked one step at a time), and the rule that ended the walk (None: none did)."""
    sizes: list[int] = []
    size, stop, refused = current, None, None
    for _ in range(MAX_CANDIDATES):
        following = control.policy.next_size(size, direction)
        if (
            stop := walk_ends(control, current, size, following, start_size, out_of_reach)
        ) is not None:
            break
        size = following  # type: ignore[assignment]  # walk_ends said it is a size
        if control.veto is None or (veto := control.veto(size)) is None:
            sizes.append(size)
        elif refused is None:
            refused = Hold("policy", f"{size} is not allowed ({veto})", f"holds: {size} refused")
    return sizes, refused or stop


def walk_ends(  # noqa: PLR0917  (the walk's state, named at its one caller)
    control: BatchController,
    current: int,
    size: int,
    following: int | None,
    start_size: int,
    out_of_reach: int | None,
) -> Hold | None:
    """Why the walk from ``size`` stops before ``following`` (None: it goes on)."""
    if following is None:
        return Hold(
            "policy",
            f"the batch policy allows no size past {size}",
            f"holds: {size} is the last",
        )
    if not current / 2 <= following <= current * 2:
        return Hold(
            "band",
            f"the next size the policy allows, {following}, is more than 2× away",
            "holds: next size past 2×",
        )
    if following < start_size:
        return Hold(
            "floor",
            f"never below the size the run started at, {start_size}",
            f"holds: not below {start_size}",
        )
    if out_of_reach is not None and following >= out_of_reach:
        return Hold(
            "reach",
            f"the loss diverged at {out_of_reach}: it and every size above stay out of reach",
            f"holds: {out_of_reach} diverged",
        )
    if (why := control.fit_reason(following)) is not None:
        # a size that may not fit, and every one beyond it
        return Hold("fit", f"{following} may not fit ({why})", f"holds: {following} may not fit")
    return None


def measuring_back(control: BatchController, current: int, size: int) -> Hold | None:
    """Whether a change to ``size``, back toward the size the latest change left, waits
    (None: it may go): the size the change went to has not run the windows the throughput
    verdict needs. Until then its step time is a window or two: on a busy machine one
    quarter second read 128 nearly twice 64's step (B½ 8), and the demo's autopilot went
    64 → 128 → 64 in 33 steps on it, where the verdict later said too little was measured at
    128 to compare. A divergence goes back at once (the advisor's ``back``), a trial by its
    own measurement."""
    latest = control.watch.latest
    if latest is None or latest.new != current or (size - current) * (latest.old - current) <= 0:
        return None
    throughput = control.watch.sizes.get(current)
    windows = throughput.windows if throughput is not None else 0
    if windows >= VERDICT_WINDOWS:
        return None
    return Hold(
        "verdict",
        f"back toward {latest.old} waits until {current}'s throughput is measured ({windows} of "
        f"{VERDICT_WINDOWS} windows)",
        f"holds: measuring {current}",
    )


def hold_for(
    current: int, best: tuple[int | None, float], stop: Hold | None, model: StepTimeModel
) -> Hold:
    """The rule that kept ``current`` where the target lies one way: no size that way
    (``stop``: what ended the walk), or none that promises enough."""
    size, gain = best
    if size is None:
        stop = stop or Hold("none", "no size within 2× that fits and is allowed", "holds: no size")
        return stop._replace(text=f"holding at {current}: {stop.text}")
    shown = below_threshold(gain)
    text = (
        f"holding at {current}: {size} predicted {shown}× the progress per second, "
        f"and a change needs {THRESHOLD:g}×"
    )
    if "assumed" in model.how:
        text += f" (B½ taken as {count(model.half_batch)}: one size measured so far)"
    if (price := model.price(size, current)) is not None:
        text += f"; {price}"
    return Hold("threshold", text, f"holds: {shown}× < {THRESHOLD:g}×")


def below_threshold(gain: float) -> str:
    """A gain that did not reach the threshold, in enough figures to read below it."""
    for digits in (2, 3):
        if float(shown := f"{gain:.{digits}f}") < THRESHOLD:
            return shown
    return f"{gain:.4f}"
