"""A step's seconds in each phase (``Phases``) and their sums over steps (``PhaseTotals``).

Plain types without torch, apart from ``phases`` (which reads the marks): the record's spans
hold a ``PhaseTotals`` (``record.format.Span.phases``), and the record is the dashboard's face.
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec


class Phases(NamedTuple):
    """One step's seconds in each phase (None: not measured); see ``anatomy.phases``."""

    data: float | None
    forward: float
    backward: float
    optimizer: float | None
    other: float
    comm: float | None = None  # collective wait: DDP's (out of backward), FSDP2's (out of both)
    comm_total: float | None = None  # FSDP2's collectives' own time, exposed or hidden


class PhaseTotals(msgspec.Struct, omit_defaults=True):
    """Summed seconds of each step phase over ``steps`` steps (the step anatomy). A phase
    that none of the steps measured stays None. Merges exactly."""

    steps: int = 0
    step_s: float = 0.0  # the steps' training time
    data_s: float | None = None
    forward_s: float = 0.0
    backward_s: float = 0.0
    optimizer_s: float | None = None
    other_s: float = 0.0
    comm_s: float | None = None
    comm_total_s: float | None = None

    def add(self, step_s: float, phases: Phases, *, steps: int = 1) -> None:
        """Count ``steps`` steps with these summed seconds in (-1: take one out again)."""
        sign = 1 if steps > 0 else -1
        self.steps += steps
        self.step_s += sign * step_s
        self.forward_s += sign * phases.forward
        self.backward_s += sign * phases.backward
        self.other_s += sign * phases.other
        if phases.data is not None:
            self.data_s = (self.data_s or 0.0) + sign * phases.data
        if phases.optimizer is not None:
            self.optimizer_s = (self.optimizer_s or 0.0) + sign * phases.optimizer
        if phases.comm is not None:
            self.comm_s = (self.comm_s or 0.0) + sign * phases.comm
        if phases.comm_total is not None:
            self.comm_total_s = (self.comm_total_s or 0.0) + sign * phases.comm_total

    def merged(self, other: PhaseTotals | None) -> PhaseTotals:
        """These steps followed by ``other``'s, as a new total."""
        out = msgspec.structs.replace(self)
        if other is not None:
            sums = Phases(
                other.data_s,
                other.forward_s,
                other.backward_s,
                other.optimizer_s,
                other.other_s,
                other.comm_s,
                other.comm_total_s,
            )
            out.add(other.step_s, sums, steps=other.steps)
        return out
