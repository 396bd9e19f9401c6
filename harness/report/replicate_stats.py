"""Did the headline comparison replicate across tries? (pure: each try's ratio in, a verdict out)

A replicating campaign (`replicate: {tries, within_pct, wait_s}`) measures each comparison (a cell's mean tok/s
over the base cell's, on one device) once per try. The spread of a comparison over its tries is given two ways:
max/min - 1 (the largest try above the smallest: every pair of tries within it), and (max - min) / median. It
replicated when every try has a ratio and max/min - 1 <= within_pct; when it did not, it missed by the spread
less within_pct, in percentage points. A campaign replicated when every comparison did; it missed by the
largest miss. Tries lacking a ratio (runs pending or failed) leave it incomplete: k of n tries have one."""

from __future__ import annotations

import math
from dataclasses import dataclass

REPLICATED = "replicated"
NOT_REPLICATED = "not replicated"
INCOMPLETE = "incomplete"


def spread(points: list[float]) -> tuple[float, float]:
    """(max/min - 1, (max - min)/median), in percent, of a comparison's ratios over its tries; NaN for fewer than
    two, or any ratio not positive and finite."""
    if len(points) < 2 or not all(math.isfinite(x) and x > 0 for x in points):
        return math.nan, math.nan
    lo, hi = min(points), max(points)
    s = sorted(points)
    n = len(s)
    med = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
    return 100 * (hi / lo - 1), 100 * (hi - lo) / med


@dataclass(frozen=True)
class Comparison:
    """One comparison over the tries: its ratio in each try (None: that try has none)."""

    device: str | None  # None: the campaign's one target, or every device of a spread fleet
    cell: str  # the cell's label
    base: str  # its base's label
    ratios: tuple[float | None, ...]  # one per try, in try order (points; None where the try has no ratio)
    within_pct: float

    @property
    def n_tries(self) -> int:
        return len(self.ratios)

    @property
    def done(self) -> int:
        """Tries with a ratio."""
        return sum(r is not None for r in self.ratios)

    @property
    def complete(self) -> bool:
        return self.done == self.n_tries

    @property
    def spread_pct(self) -> float:
        """max/min - 1 over the tries that have a ratio, in percent."""
        return spread([r for r in self.ratios if r is not None])[0]

    @property
    def range_median_pct(self) -> float:
        return spread([r for r in self.ratios if r is not None])[1]

    @property
    def state(self) -> str:
        if not self.complete:
            return INCOMPLETE
        return REPLICATED if self.spread_pct <= self.within_pct else NOT_REPLICATED

    @property
    def miss_pp(self) -> float:
        """How far the spread went past within_pct, in percentage points (<= 0: within it)."""
        return self.spread_pct - self.within_pct


@dataclass(frozen=True)
class Verdict:
    state: str  # REPLICATED | NOT_REPLICATED | INCOMPLETE
    tries: int  # asked
    tries_done: int  # tries in which every comparison has a ratio
    within_pct: float
    worst: Comparison | None  # the comparison with the widest spread (None: no comparison)

    @property
    def miss_pp(self) -> float:
        return self.worst.miss_pp if self.worst is not None else math.nan

    def line(self) -> str:
        """One line, as `bmoe-bench check` prints it."""
        w = self.worst
        if self.state == INCOMPLETE or w is None:
            return f"replicate: incomplete: {self.tries_done} of {self.tries} tries have every ratio"
        where = f"{w.cell} / {w.base}" + (f" on {w.device}" if w.device else "")
        if self.state == REPLICATED:
            return (f"replicate: replicated within {self.within_pct:g}% over {self.tries} tries (widest spread "
                    f"{w.spread_pct:.2f}%, {where})")
        return (f"replicate: not replicated by {w.miss_pp:.2f} pp: spread {w.spread_pct:.2f}% (max/min - 1) over "
                f"{self.tries} tries against {self.within_pct:g}% asked ({where})")


def verdict(comparisons: list[Comparison], tries: int, within_pct: float) -> Verdict:
    """The campaign's verdict over all its comparisons (each with `tries` ratios)."""
    done = sum(all(c.ratios[k] is not None for c in comparisons) for k in range(tries)) if comparisons else 0
    if not comparisons or any(not c.complete for c in comparisons):
        return Verdict(INCOMPLETE, tries, done, within_pct, None)
    worst = max(comparisons, key=lambda c: c.spread_pct)
    state = REPLICATED if all(c.state == REPLICATED for c in comparisons) else NOT_REPLICATED
    return Verdict(state, tries, done, within_pct, worst)
