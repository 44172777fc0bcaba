"""``mon.log``'s values on their way to the agent thread: every call's, or, on a loop that
logs faster than a dashboard can show, the latest value of each name.

Every value logged stays alive until the agent thread has read it, and a loss tensor keeps
its step's autograd graph with it. On a step of a few hundred microseconds that costs the
training thread more than everything else bsmon does: a loop that keeps its loss for another
thread to read adds 5–9 µs a step (docs/benchmarks.md, round three), bsmon's hooks 2–3. So
while a tick brings more than ``SAMPLE_ABOVE`` calls (640 a second), ``log`` keeps
only the latest value of each name (``dict.update``, as cheap as the append it replaces, and
the value it replaces is freed by the job's own thread, as a bare loop frees it): the agent
reads each name's latest value once a tick, so a rare name (a validation loss) is never lost,
and a frequent one is sampled once a tick, four times a second. Once the steps slow to under
``ALL_BELOW`` a tick (320 a second), every call is kept again.

The first tick is not waited for: the steps' ends are timed once at the start
(``early``, on the training thread, at two scheduled step boundaries), and a loop already
faster than ``SAMPLE_ABOVE`` a tick keeps only the latest values from its ``SAMPLE_ABOVE``-th
step. Waiting held a whole tick's losses (~660 on a 150 µs step) with their graphs, and the
heap they left cost the steps that followed (1–2 µs a step, docs/benchmarks.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from operator import itemgetter
from typing import Any

from ..wire.protocol import Event
from .hot_path import FINISHED
from .inbox import TICK_S, Inbox, take_all

SAMPLE_ABOVE = 160  # calls a tick (0.25 s) above which only each name's latest value is kept
ALL_BELOW = 80  # steps a tick under which every call is kept again


class LoggedIntake:
    """Agent thread: a tick's logged values as columns by name, and the mode ``log`` runs in
    (``keep_latest``: the monitor's switch, called when the mode changes)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.latest_only = False
        self.keep_latest: Callable[[bool], None] = lambda _on: None
        self._seen: dict[str, Any] = {}  # each name's latest value read (held: see take)
        self._said = False
        self.timing_start = True  # early() still wants step boundaries
        self._first_end: float | None = None  # when the first step ended (perf_counter)
        self._timed_to = 0  # the step whose end closes the timing
        self._early_calls = 0  # the steps a tick the start was timed at, once it switched
        # the mode is judged on the rate over at least a tick's period: a flush's tick may
        # come a moment after the last one with a few steps, which is not a slow loop
        self._clock = clock
        self._window_start = clock()
        self._window_steps = self._window_calls = 0
        self._held = False

    def hold_mode(self, latest_only: bool) -> None:
        """Run in this mode and judge it no more: a benchmark counting the calls of steps it
        slows (under a profiler) counts them in the mode it names, whatever the machine's load
        makes of their speed."""
        self._held = True
        if latest_only != self.latest_only:
            self._switch(latest_only)

    def at_boundary(self, step: int, now: float) -> int:
        """The scheduled boundary: the next step whose start ``early`` wants timed."""
        if self.timing_start and (following := self.early(step, now)) is not None:
            return following
        return FINISHED

    def early(self, step: int, now: float) -> int | None:
        """Training thread, at a step boundary: time the first ``SAMPLE_ABOVE`` steps and keep
        only the latest values at once if they came faster than ``SAMPLE_ABOVE`` a tick.
        Returns the step whose end it needs next (None: it is done)."""
        if self._first_end is None:
            self._first_end, self._timed_to = now, step + SAMPLE_ABOVE
            return self._timed_to
        if step < self._timed_to:  # a boundary something else asked for
            return self._timed_to
        self.timing_start = False
        steps = step - self._timed_to + SAMPLE_ABOVE
        per_tick = int(steps * TICK_S / max(now - self._first_end, 1e-9))
        if per_tick > SAMPLE_ABOVE and not self.latest_only:
            self._early_calls = per_tick
            self._switch(True)
        return None

    def take(
        self, inbox: Inbox, steps: int, into: dict[str, list[Any]], step: int, backwards: int = 0
    ) -> Event | None:
        """Add what was logged since the last take to ``into``; ``steps``: the steps this
        tick took; ``backwards``: the tensors backward() was called on it brought (``bsmon
        run``'s loss, kept the same way). Returns an event the first time only the latest
        values are kept."""
        early, self._early_calls = self._early_calls, 0
        calls = backwards
        if inbox.logged:
            dicts = take_all(inbox.logged)
            calls = max(calls, len(dicts))
            _as_columns(dicts, into)
        if inbox.latest:
            seen = self._seen
            for name, value in list(inbox.latest.items()):  # a copy: log may add a name
                if value is not seen.get(name):
                    # held until replaced, so that no new value can take its identity
                    seen[name] = value
                    into.setdefault(name, []).append(value)
        steps_a_tick, calls_a_tick = self._rates(steps, calls)
        if steps_a_tick is None or self._held:
            pass  # under a period since the rate was last judged, or held
        elif self.latest_only and steps_a_tick < ALL_BELOW:
            self._switch(False)
        elif not self.latest_only and calls_a_tick > SAMPLE_ABOVE:
            self._switch(True)
        if not self.latest_only or self._said:
            return None
        self._said = True
        calls = max(early, calls_a_tick)
        return Event(
            t=time.time(),
            step=step,
            kind="logging_sampled",
            message=(
                f"the loop logs {calls} values a tick: the loss and the values shown and "
                "recorded are now each one's latest, four a second, while it stays fast"
            ),
        )

    def _rates(self, steps: int, calls: int) -> tuple[int | None, int]:
        """Steps and calls a tick's period over the takes since the rate was last judged,
        once that is at least a period ago (else None, 0)."""
        self._window_steps += steps
        self._window_calls += calls
        now = self._clock()
        elapsed = now - self._window_start
        if elapsed < TICK_S:
            return None, 0
        scale = TICK_S / elapsed
        rates = round(self._window_steps * scale), round(self._window_calls * scale)
        self._window_start, self._window_steps, self._window_calls = now, 0, 0
        return rates

    def _switch(self, latest_only: bool) -> None:
        self.latest_only = latest_only
        self.keep_latest(latest_only)


def _as_columns(dicts: list[dict[str, Any]], into: dict[str, list[Any]]) -> None:
    names = set(map(tuple, dicts))
    if len(names) == 1:  # every call logged the same names (the usual case): columns
        for name in names.pop():
            into.setdefault(name, []).extend(map(itemgetter(name), dicts))
        return
    for scalars in dicts:
        for name, value in scalars.items():
            into.setdefault(name, []).append(value)
