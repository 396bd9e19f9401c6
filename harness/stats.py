"""Bootstrap confidence intervals and the checks that say when not to trust them. Pure: arrays in,
dataclasses out; no files, no printing.

- Per run, tok/s = tokens / sum of their wall time (after the warm-up tokens are trimmed).
- Per cell, a 95% CI of the mean tok/s across repeats (percentile bootstrap over runs); with a single
  run, over its tokens instead (statistic n / sum(wall)), which ignores run-to-run variance and token
  autocorrelation: `Interval.basis` says which.
- A cell against the base cell: ratio of mean tok/s, two-sample bootstrap (each sample resampled on its
  own), over runs when both have at least two, else over tokens.
All bootstraps are seeded (numpy Generator) so reports regenerate byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import stats as sps

N_RESAMPLES = 4000
CONFIDENCE = 0.95
METHOD = "percentile"  # robust with 2-5 runs, where BCa's jackknife is degenerate

DRIFT_LIMIT = 0.05  # |last round / first round - 1| above this is drift
CV_LIMIT = 0.10  # coefficient of variation of per-run tok/s above this is high variance
MIN_RUNS = 3
TEMP_RISE_C = 5.0


@dataclass(frozen=True)
class Interval:
    point: float
    low: float
    high: float
    basis: str  # "runs" | "tokens"
    n: int  # runs or tokens it rests on

    def overlaps(self, other: Interval) -> bool:
        return self.low <= other.high and other.low <= self.high

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high


@dataclass(frozen=True)
class Finding:
    """A warning about the data, with the remedy in the message."""

    kind: str  # drift | throttling | variance | few-runs | failed | gate
    message: str
    cell: str | None = None


def tok_s(wall_ms: np.ndarray) -> float:
    """Tokens per second of one run: number of tokens / their summed wall time."""
    w = np.asarray(wall_ms, dtype=float)
    if w.size == 0 or w.sum() <= 0:
        return float("nan")
    return w.size / (w.sum() / 1000.0)


def trim(wall_ms: np.ndarray, warmup: int) -> np.ndarray:
    return np.asarray(wall_ms, dtype=float)[warmup:]


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _boot(data: tuple[np.ndarray, ...], statistic, seed: int) -> tuple[float, float]:
    res = sps.bootstrap(data, statistic, n_resamples=N_RESAMPLES, confidence_level=CONFIDENCE, method=METHOD,
                        vectorized=True, paired=False, rng=_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def _mean(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis)


def _tokens_rate(w: np.ndarray, axis: int = -1) -> np.ndarray:
    return 1000.0 / np.mean(w, axis=axis)


def cell_interval(runs: list[np.ndarray], seed: int) -> Interval | None:
    """runs: trimmed wall_ms per successful run of one cell."""
    runs = [np.asarray(r, dtype=float) for r in runs if len(r) > 0]
    if not runs:
        return None
    if len(runs) >= 2:
        rates = np.array([tok_s(r) for r in runs])
        lo, hi = _boot((rates,), _mean, seed)
        return Interval(float(rates.mean()), lo, hi, "runs", len(runs))
    w = runs[0]
    if w.size < 2:
        p = tok_s(w)
        return Interval(p, p, p, "tokens", int(w.size))
    lo, hi = _boot((w,), _tokens_rate, seed)
    return Interval(tok_s(w), lo, hi, "tokens", int(w.size))


def ratio_interval(cell_runs: list[np.ndarray], base_runs: list[np.ndarray], seed: int) -> Interval | None:
    """Mean tok/s of a cell divided by the base cell's, with a two-sample bootstrap CI."""
    a = [np.asarray(r, dtype=float) for r in cell_runs if len(r) > 0]
    b = [np.asarray(r, dtype=float) for r in base_runs if len(r) > 0]
    if not a or not b:
        return None
    if len(a) >= 2 and len(b) >= 2:
        ra = np.array([tok_s(r) for r in a])
        rb = np.array([tok_s(r) for r in b])
        lo, hi = _boot((ra, rb), lambda x, y, axis=-1: np.mean(x, axis=axis) / np.mean(y, axis=axis), seed)
        return Interval(float(ra.mean() / rb.mean()), lo, hi, "runs", min(len(a), len(b)))
    wa, wb = np.concatenate(a), np.concatenate(b)
    point = float(wb.mean() / wa.mean())  # (1000/mean wa) / (1000/mean wb)
    if wa.size < 2 or wb.size < 2:
        return Interval(point, point, point, "tokens", int(min(wa.size, wb.size)))
    lo, hi = _boot((wa, wb), lambda x, y, axis=-1: np.mean(y, axis=axis) / np.mean(x, axis=axis), seed)
    return Interval(point, lo, hi, "tokens", int(min(wa.size, wb.size)))


# ---- warnings that name a remedy ----------------------------------------------------------------------


@dataclass(frozen=True)
class RunPoint:
    """What the checks need about one finished run."""

    cell: str
    round: int
    position: int
    tok_s: float
    entry_cpu_temp_c: float | None = None
    entry_freq_frac: float | None = None  # min over policies of scaling_max / cpuinfo_max at entry
    max_cpu_temp_c: float | None = None  # hottest sample during the run
    min_freq_frac: float | None = None  # lowest scaling_max/cpuinfo_max during the run
    extra: dict = field(default_factory=dict)


def drift_check(points: list[RunPoint]) -> Finding | None:
    """Median over cells of (tok/s in the last round / tok/s in the first round)."""
    if not points:
        return None
    first, last = min(p.round for p in points), max(p.round for p in points)
    if first == last:
        return None
    ratios = []
    for cell in sorted({p.cell for p in points}):
        f = [p.tok_s for p in points if p.cell == cell and p.round == first]
        la = [p.tok_s for p in points if p.cell == cell and p.round == last]
        if f and la and f[0] > 0:
            ratios.append(la[0] / f[0])
    if not ratios:
        return None
    med = float(np.median(ratios))
    if abs(med - 1) <= DRIFT_LIMIT:
        return None
    return Finding("drift", f"tok/s changed by {med - 1:+.1%} from round {first + 1} to round {last + 1} "
                            f"(median over cells): the machine drifted (heat, background load). Tighten the "
                            f"cooldown gate (lower cpu_temp_max_c, longer max_wait_s), keep order: alternating "
                            f"so drift cancels, or rerun on a quiet machine.")


def throttle_check(points: list[RunPoint]) -> Finding | None:
    pts = sorted(points, key=lambda p: p.position)
    fr = [p.entry_freq_frac for p in pts if p.entry_freq_frac is not None]
    fr_run = [p.min_freq_frac for p in pts if p.min_freq_frac is not None]
    temps = [p.entry_cpu_temp_c for p in pts if p.entry_cpu_temp_c is not None]
    why = []
    if fr and min(fr) < fr[0] - 0.02:
        why.append(f"the CPU frequency ceiling at entry fell to {min(fr):.0%} of its first value {fr[0]:.0%}")
    elif fr_run and min(fr_run) < 0.98 and (not fr or min(fr_run) < min(fr) - 0.02):
        why.append(f"the CPU frequency ceiling fell to {min(fr_run):.0%} of the hardware maximum during runs")
    if len(temps) >= 2 and max(temps[1:]) - temps[0] > TEMP_RISE_C:
        why.append(f"the CPU entered runs up to {max(temps[1:]) - temps[0]:.1f} C hotter than the first run")
    if not why:
        return None
    return Finding("throttling", "Throttling: " + "; ".join(why) + ". Set cooldown.cpu_temp_max_c near the "
                   "first run's entry temperature and a longer max_wait_s, or cool the device between runs.")


def variance_check(cell: str, rates: list[float]) -> Finding | None:
    r = np.asarray(rates, dtype=float)
    if r.size < 2 or r.mean() <= 0:
        return None
    cv = float(r.std(ddof=1) / r.mean())
    if cv <= CV_LIMIT:
        return None
    return Finding("variance", f"{cell}: tok/s varies {cv:.0%} (coefficient of variation) across its "
                               f"{r.size} runs: add repeats, stop background work, and check the entry state "
                               f"of the slow runs.", cell)


def few_runs_check(cell: str, n_ok: int) -> Finding | None:
    if n_ok >= MIN_RUNS:
        return None
    if n_ok == 0:
        return Finding("few-runs", f"{cell}: no successful run, so no figure: see the failed runs' reasons "
                                   f"and rerun the campaign (finished runs are kept).", cell)
    basis = ("its CI is over the tokens of one run and ignores run-to-run variance" if n_ok == 1
             else "a bootstrap over 2 runs understates the spread")
    return Finding("few-runs", f"{cell}: only {n_ok} successful run{'s' if n_ok > 1 else ''}: {basis}; "
                               f"set repeats: {MIN_RUNS} or more.", cell)


def freq_fraction(cpufreq: dict | None) -> float | None:
    """min over policies of scaling_max_khz / cpuinfo_max_khz, or None when unknown."""
    fracs = []
    for pol in (cpufreq or {}).values():
        s, h = pol.get("scaling_max_khz"), pol.get("cpuinfo_max_khz")
        if s and h:
            fracs.append(s / h)
    return min(fracs) if fracs else None
