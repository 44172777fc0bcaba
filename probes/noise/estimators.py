"""The unbiased two-batch-size estimators of McCandlish et al. (2018, App. A.1), in one form.

Every bsmon estimator sees, for one optimizer step, the squared norm of the step's gradient
``Y = |ḡ|²`` (``ḡ = p.grad``, ``N`` examples) and the squared norms ``|c_u|²`` of the
contributions of *units* that make up the step: single examples (per-example norms),
micro-batches (gradient accumulation), this rank's share (DDP), or the previous step
(``sequential``). Unit ``u`` holds ``b_u`` examples; every example weighs the same in ``ḡ``,
so the unit's mean gradient is ``m_u = (N/b_u)·c_u``. Then

    E|m_u|² = |G|² + tr Σ / b_u          E Y = |G|² + tr Σ / N

and, averaged over the units observed,

    tr Σ ≈ mean_u (|m_u|² − Y) / (1/b_u − 1/N)        |G|² ≈ Y − (tr Σ)/N

are both unbiased (each term is). With equal units this is eq. A.2 / the U-statistic of the
research note §1.4; with ``b_u = 1`` it is the per-example form ``𝒮 = (A − Q)·B/(B−1)``.

Whatever fixed factor the loss reduction puts on every contribution (``mean`` vs ``sum``,
dividing by the number of micro-batches, a loss scale) multiplies ``|G|²`` and ``tr Σ`` alike,
so their ratio ``B_simple = tr Σ / |G|²`` does not depend on it (note §6.9).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Units:
    """``count`` units of ``size`` examples each whose contributions have ``Σ|c_u|² = sq_sum``."""

    sq_sum: float
    count: int
    size: float


@dataclass(frozen=True, slots=True)
class StepComponents:
    """One step's unbiased estimates of |G|² and tr Σ (in the loss's own gradient units)."""

    g2: float
    trace: float


class EstimateError(ValueError):
    """The step's numbers cannot form an estimate (the reason is in the message)."""


def components(total_sq: float, examples: float, groups: list[Units]) -> StepComponents:
    """Unbiased |G|² and tr Σ from the step's squared norm and its units' squared norms."""
    if not groups:
        raise EstimateError("no units observed")
    n = float(examples)
    terms = 0.0
    units = 0
    for group in groups:
        if group.count <= 0:
            continue
        if not 0 < group.size < n:
            raise EstimateError(
                f"a unit of {group.size:g} example{'' if group.size == 1 else 's'} cannot be "
                f"compared with a step of {n:g}"
            )
        unit_sq_mean_sum = n * n * group.sq_sum / (group.size * group.size)  # Σ_u |m_u|²
        terms += (unit_sq_mean_sum - group.count * total_sq) / (1.0 / group.size - 1.0 / n)
        units += group.count
    if units == 0:
        raise EstimateError("no units observed")
    trace = terms / units
    return StepComponents(g2=total_sq - trace / n, trace=trace)


def per_example(sq_sum: float, total_sq: float, examples: int) -> StepComponents:
    """Per-example norms: ``sq_sum = Σ_i |c_i|²`` over the step's ``examples`` examples."""
    return components(total_sq, examples, [Units(sq_sum, examples, 1.0)])


def finite(*values: float) -> bool:
    return all(math.isfinite(v) for v in values)
