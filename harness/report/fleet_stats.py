"""Do the devices of a spread campaign differ? (pure: tok/s per run in, a test out)

A spread campaign shares the runs of one matrix among devices of one kind: its cells' figures pool every
device's runs, which is right only if the devices are alike. The test: a one-way analysis of variance of log
tok/s across devices within each cell, pooled over the cells (the model "each cell on each device has its own
mean" against "each cell has one mean"): F = (between-device sum of squares within cells / its degrees of
freedom, the sum over cells of devices - 1) / (the runs' sum of squares around their own cell-and-device mean /
runs - cell-and-device groups). Under alike devices and a spread of runs the same on every device, F follows
F(df1, df2): its p-value is the chance of devices differing at least this much by chance. A device effect
the same in every cell and one that differs between cells are both caught (a main effect and an interaction).
Per cell the same test on that cell's runs alone, and a Kruskal-Wallis test beside it (ranks: no normality
assumed, but coarse at few runs: with two runs on each of two devices it cannot go below p = 0.12).

Measured (tests/report/test_fleet_report.py, 2000 seeded known-truth campaigns a case, alpha 0.05): alike devices
refused in 3.8-4.9% of campaigns (2-8 devices, 2-5 runs each, 1-3 cells, normal or heavy-tailed t(3) noise; the
test is blind to the spread's size); one device of four 10% slower, runs 5% apart, 3 runs a device in each of 3
cells: caught in 92%; one device 10% faster in one cell and 10% slower in another (no effect on average): 70%."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

ALPHA = 0.05
_TINY = 1e-24  # per run: squared log deviations below this are rounding, not spread (identical runs)


@dataclass(frozen=True)
class CellTest:
    label: str
    n_devices: int
    n_runs: int
    f: float
    p_anova: float  # NaN: cannot be tested (no device ran the cell twice)
    p_kruskal: float  # NaN: cannot be computed (every run the same)


@dataclass(frozen=True)
class DeviceTest:
    """The pooled test over every cell that ran on two devices or more."""

    f: float
    df1: int
    df2: int
    p: float  # NaN: cannot be tested (no device ran any cell twice: no spread of runs to compare with)
    cells: tuple[CellTest, ...]

    @property
    def tested(self) -> bool:
        return math.isfinite(self.p)

    @property
    def refuses(self) -> bool:
        """The devices differ at ALPHA: pooling their runs is refused."""
        return self.tested and self.p < ALPHA


def _sums(groups: list[np.ndarray]) -> tuple[float, int, float, int]:
    """(between-group SS, its df, within-group SS, its df) of one cell's log tok/s, grouped by device."""
    allx = np.concatenate(groups)
    mu = float(allx.mean())
    ss_b = float(sum(x.size * (float(x.mean()) - mu) ** 2 for x in groups))
    ss_w = float(sum(float(((x - x.mean()) ** 2).sum()) for x in groups))
    return ss_b, len(groups) - 1, ss_w, int(allx.size) - len(groups)


def f_test(ss_b: float, df1: int, ss_w: float, df2: int, n: int) -> tuple[float, float]:
    """(F, p). Runs identical within every group: p 1 when the groups agree too, 0 when they do not."""
    if df1 < 1 or df2 < 1:
        return math.nan, math.nan
    if ss_w <= _TINY * n:
        return (0.0, 1.0) if ss_b <= _TINY * n else (math.inf, 0.0)
    f = (ss_b / df1) / (ss_w / df2)
    return f, float(sps.f.sf(f, df1, df2))


def _kruskal(groups: list[np.ndarray]) -> float:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return float(sps.kruskal(*groups).pvalue)
    except ValueError:  # every value the same
        return math.nan


def device_test(groups: dict[str, dict[str, list[float]]]) -> DeviceTest | None:
    """groups: cell label -> device label -> the tok/s of that cell's runs on that device. None when no cell
    ran on two devices."""
    ss_b = ss_w = 0.0
    df1 = df2 = n = 0
    cells = []
    for label, by_device in groups.items():
        logs = [np.log(np.asarray(v, dtype=float)) for v in by_device.values() if len(v)]
        if not logs:
            continue
        b, d1, w, d2 = _sums(logs)
        k = sum(x.size for x in logs)
        ss_w, df2, n = ss_w + w, df2 + d2, n + k  # every cell-and-device group tells the runs' spread
        if len(logs) < 2:
            continue
        ss_b, df1 = ss_b + b, df1 + d1
        f, p = f_test(b, d1, w, d2, k)
        cells.append(CellTest(label, len(logs), k, f, p, _kruskal(logs)))
    if df1 == 0:
        return None
    f, p = f_test(ss_b, df1, ss_w, df2, n)
    return DeviceTest(f, df1, df2, p, tuple(cells))


def p_text(p: float) -> str:
    """A p-value as findings.md prints it."""
    if not math.isfinite(p):
        return "n/a"
    return "< 0.0001" if p < 1e-4 else f"{p:.4f}" if p < 0.01 else f"{p:.2f}"


def p_is(p: float) -> str:
    """`p = 0.012` or `p < 0.0001`, for a sentence."""
    return f"p {p_text(p)}" if p_text(p).startswith("<") else f"p = {p_text(p)}"
