"""Repeats driven by precision (campaign key `precision:`), the pure part: which runs a round adds, and
whether the campaign stops after a round. The runner (harness.campaigns.rounds) reads the finished runs
and asks `decide`; the report (harness.report.results) names the outcome with `outcome`; the simulation
in tests/test_interval_coverage.py drives the same `decide` to show the intervals still hold with stopping
on the data."""

from __future__ import annotations

from harness.campaigns.expand import RunSpec, order_runs
from harness.formats.campaign import Precision
from harness.stats import Interval, precision_reached

PRECISE = "precise"
AT_MAX = "max"


def round_runs(n_cells: int, rnd: int, order: str, seed: int) -> list[RunSpec]:
    """The runs of round `rnd` (0-based), in the order the campaign's first rounds follow (order_runs is
    the same for every number of rounds, so round k is the same whether planned up front or added)."""
    return order_runs(n_cells, rnd + 1, order, seed)[rnd * n_cells:]


def decide(ratios: list[Interval | None], rounds: int, p: Precision) -> str | None:
    """After `rounds` whole rounds: PRECISE (every ratio within +-half-width), AT_MAX (the maximum ran), or
    None: add a round. Nothing stops before the minimum."""
    if p.min_repeats is not None and rounds < p.min_repeats:
        return None
    if precision_reached(ratios, p.ratio_half_width):
        return PRECISE
    return AT_MAX if rounds >= p.max_repeats else None


def printed(ratio: Interval | None, outcome: str | None) -> Interval | None:
    """The ratio interval as printed: sequential (wider) when the campaign stopped once precise."""
    return ratio.sequential() if ratio is not None and outcome == PRECISE else ratio


def describe(p: Precision) -> str:
    return f"ratios within +-{p.ratio_half_width:.0%}, {p.min_repeats}-{p.max_repeats} rounds"
