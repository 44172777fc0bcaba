"""Issue 22's goals for benchmarks/hostcost.py: each goal's ratio to a floor, with a bootstrap
interval over the rounds, and its verdict; and the spread of a row's rounds."""

from __future__ import annotations

import math
import random
import statistics


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, median, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return q1, median, q3


GOALS = (  # issue 22: (configuration, the most it may cost, in floors)
    ("telemetry (noise, anatomy, record off)", 2),
    ("+ record", 3),  # the defaults without the noise scale's own measured-step budget
)
FLOORS = (
    "floor: perf_counter + append in a post-hook",  # issue 22's
    "floor + loss kept: latest.update(loss=loss)",  # what every row but bare logs
)
RESAMPLES = 4000


def ratio_interval(
    costs: list[float], floors: list[float], rng: random.Random
) -> tuple[float, float, float]:
    """The ratio of the medians of two lists of per-round costs, with a 90% bootstrap
    interval (rounds drawn again with replacement, the same rounds for both: a round's
    configuration and floor share its minutes)."""
    pairs = list(zip(costs, floors, strict=True))
    ratios = []
    for _ in range(RESAMPLES):
        drawn = rng.choices(pairs, k=len(pairs))
        floor_median = statistics.median(f for _, f in drawn)
        if floor_median > 0:
            ratios.append(statistics.median(c for c, _ in drawn) / floor_median)
    ratios.sort()
    if len(ratios) < RESAMPLES // 2:  # the floor itself is not told apart from nothing
        return math.nan, math.nan, math.nan
    low, high = ratios[len(ratios) // 20], ratios[len(ratios) * 19 // 20]
    return statistics.median(costs) / statistics.median(floors), low, high


def spread(values: list[float]) -> str:
    q1, median, q3 = quartiles(values)
    return f"{median:+6.1f} [{q1:+.1f}, {q3:+.1f}]"


def print_goals(measures: dict[str, dict[str, list[float]]]) -> None:
    """Each goal's verdict against each floor, by each measure: met when the bootstrap
    interval of the ratio lies at or under it, not met when over it, otherwise not told
    apart on this machine."""
    rng = random.Random(22)
    for floor_name in FLOORS:
        if floor_name not in measures["ordinary step"]:
            continue
        print(f"\nagainst {floor_name}:")
        for name, most in GOALS:
            for measure, added_us in measures.items():
                if name not in added_us:
                    continue
                ratio, low, high = ratio_interval(added_us[name], added_us[floor_name], rng)
                if math.isnan(ratio):
                    verdict = "no verdict: the floor is not told apart from bare"
                elif high <= most:
                    verdict = "met"
                elif low > most:
                    verdict = "not met"
                else:
                    verdict = "not told apart from the goal; run more rounds"
                print(
                    f"  {name}, {measure}: {ratio:.1f}× [{low:.1f}, {high:.1f}] "
                    f"(goal ≤ {most}×): {verdict}"
                )
