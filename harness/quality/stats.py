"""Exact statistics for graded replies: per-cell accuracy with its Clopper-Pearson interval, and the exact
(binomial) McNemar test of a cell against the base on the same questions. scipy is already a dependency of
bmoe, so both come from its beta and binomial distributions rather than hand-written code."""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy.stats import beta, binom

ALPHA = 0.05


@dataclass(frozen=True)
class Accuracy:
    correct: int
    n: int
    low: float
    high: float

    @property
    def point(self) -> float:
        return self.correct / self.n if self.n else math.nan


def clopper_pearson(k: int, n: int, alpha: float = ALPHA) -> tuple[float, float]:
    """The exact two-sided (1 - alpha) interval for a binomial proportion k/n."""
    if n <= 0 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
    lo = 0.0 if k == 0 else float(beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - alpha / 2, k + 1, n - k))
    return lo, hi


def accuracy(grades: list[bool], alpha: float = ALPHA) -> Accuracy:
    k, n = sum(grades), len(grades)
    lo, hi = clopper_pearson(k, n, alpha) if n else (math.nan, math.nan)
    return Accuracy(k, n, lo, hi)


@dataclass(frozen=True)
class McNemar:
    only_base: int  # questions the base got right and the cell wrong
    only_cell: int  # the cell right, the base wrong
    p: float  # exact two-sided p-value (1.0 with no discordant pair)

    @property
    def discordant(self) -> int:
        return self.only_base + self.only_cell


def mcnemar_exact(base: list[bool], cell: list[bool]) -> McNemar:
    """Exact McNemar on paired grades: under no difference each discordant question goes either way with
    probability 1/2; p = min(1, 2 P[X <= min(b, c)]) for X ~ Binomial(b + c, 1/2)."""
    if len(base) != len(cell):
        raise ValueError("paired grades need the same questions in both cells")
    b = sum(x and not y for x, y in zip(base, cell, strict=True))
    c = sum(y and not x for x, y in zip(base, cell, strict=True))
    p = 1.0 if b + c == 0 else min(1.0, 2 * float(binom.cdf(min(b, c), b + c, 0.5)))
    return McNemar(b, c, p)


def min_discordant_for(alpha: float = ALPHA) -> int:
    """The fewest discordant questions, all going one way, that make the exact McNemar test significant."""
    m = 1
    while 2 * 0.5**m >= alpha:
        m += 1
    return m
