"""Confidence intervals of tok/s and of ratios between cells, and the checks that say when not to trust
the data. Pure: arrays in, dataclasses out; no files, no printing.

- Per run, tok/s = tokens / sum of their wall time (after the warm-up tokens are trimmed).
- Per cell, with two runs or more: the mean of per-run tok/s, with a 95% t interval over runs on the log
  scale (the mean's standard error over runs, relative to the mean; Student t with n-1 degrees of freedom;
  never below zero). With a single run there is no interval between runs: `Interval.basis` is "tokens"
  and low/high are the spread within the run (percentile bootstrap over its tokens), shown as such.
- A cell against the base cell: the ratio of their mean tok/s. Runs go in rounds, every cell once a
  round: the interval is paired, over the rounds where both ran (t over rounds of each round's
  deviations a_k/mean(a) - b_k/mean(b): a slowdown common to both runs of a round cancels). Unpaired
  (Welch t over each cell's own runs) only where fewer than two rounds have both; one run on either side:
  no interval between runs, the within-run spread as above.
- Repeats driven by precision (`precision_decision`): a ratio is precise when its interval at 99%
  (`Interval.sequential`) lies within +-h of its point; a campaign that stopped so prints that interval.

Why t and not the bootstrap, measured (tests/test_interval_coverage.py: seeded known-truth campaigns through
these functions, 2000 trials a case, 20 tokens a run, 15% run-to-run spread; `python
tests/test_interval_coverage.py` prints it all). Per cent of trials whose interval held the truth, cell /
ratio, at n repeats; before: main f271cf2's percentile bootstraps (unpaired ratio), after: this module.

    n    normal           lognormal        t(3)             drift
         before  after   before  after   before  after   before  after
     2   51/68   94/95   49/66   95/94   51/68   96/96   54/82   96/97
     3   75/81   95/96   74/81   95/94   76/81   96/96   83/88   97/95
     5   84/89   95/95   84/87   95/96   82/88   96/97   90/93   97/95
    10   90/92   95/95   90/92   95/95   90/91   95/96   95/95   97/94
    20   94/95   96/97   93/94   96/95   92/94   96/96   96/96   98/95

A percentile bootstrap over n runs cannot be wider than the runs' own range: it held 49-84% at 2-5 runs and
reached 93% only at 20; a studentized bootstrap has no spread to resample at 2 runs. The t intervals hold
94-98% everywhere, so no bootstrap is kept for runs (only for a single run's within-run spread). Pairing
narrowed the ratio's interval to 85-94% of the unpaired width under drift, and widened it by 2-27% where
rounds share nothing (n-1 degrees of freedom instead of up to 2n-2). Repeats driven by precision, rounds
added until the ratio is within +-h, at most 12: stopping on a plain 95% interval held the ratio only 88-91%
of the time under normal, lognormal and drifting noise (spread 5% for h 5%, 10% for h 10%; runs that happened
to agree stop early), so the rule reads the interval at 99% and a campaign that stopped once precise prints
that one: the ratio held 95-98% (cells 94-100%) with spread 5% and 3%, h 5%, from 3 and 2 rounds, 1000
trials a case.

Stays at the root because campaigns/ (when to stop) and report/ (its intervals) use it; neither imports the other."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np
from scipy import stats as sps
from scipy.special import stdtrit

N_RESAMPLES = 4000  # the within-run token bootstrap of a single run
CONFIDENCE = 0.95
STOP_CONFIDENCE = 0.99  # a campaign that stopped once precise: see Interval.sequential
METHOD = "percentile"

# what findings.md and results.csv call each kind of interval
T_RUNS = "t over runs"
T_PAIRED = "paired t over rounds"
T_UNPAIRED = "unpaired t over runs"
ONE_RUN = "one run: spread between runs unknown"
SEQUENTIAL = "t at 99%: the campaign stopped once precise"

DRIFT_LIMIT = 0.05  # |last round / first round - 1| above this is drift
CV_LIMIT = 0.10  # coefficient of variation of per-run tok/s above this is high variance
MIN_RUNS = 3
TEMP_RISE_C = 5.0


@dataclass(frozen=True)
class Interval:
    point: float
    low: float
    high: float
    basis: str  # "runs" | "rounds" (paired) | "tokens" (one run: low/high are its within-run spread)
    n: int  # runs, rounds or tokens it rests on
    method: str = ""  # T_RUNS | T_PAIRED | T_UNPAIRED | ONE_RUN
    unpaired: Interval | None = None  # a paired ratio: the unpaired interval of the same runs, for comparison
    se_log: float = math.nan  # t intervals: the standard error on the log scale, and its degrees of freedom
    df: float = math.nan

    def overlaps(self, other: Interval) -> bool:
        return self.low <= other.high and other.low <= self.high

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high

    @property
    def between_runs(self) -> bool:
        """A 95% interval of run-to-run variation (not a single run's within-run spread)."""
        return self.basis != "tokens"

    @property
    def half_width(self) -> float:
        """The larger side of the interval, relative to its point (0.05 = within +-5%); inf for one run."""
        if not self.between_runs or not self.point > 0:
            return math.inf
        return max(self.high / self.point - 1, 1 - self.low / self.point)

    def sequential(self) -> Interval:
        """The interval a campaign that stopped adding rounds once precise prints: t at STOP_CONFIDENCE, so
        that stopping when the runs happened to agree does not leave it short of 95% (measured)."""
        if not self.between_runs or not math.isfinite(self.se_log):
            return self
        lo, hi = _log_t(self.point, self.se_log, self.df, STOP_CONFIDENCE)
        return replace(self, low=lo, high=hi, method=f"{self.method}, {SEQUENTIAL}")


@dataclass(frozen=True)
class Finding:
    """A warning about the data, with the remedy in the message."""

    kind: str  # drift | throttling | variance | few-runs | failed | gate
    message: str
    cell: str | None = None


@dataclass(frozen=True)
class CellRuns:
    """One cell's successful runs: the trimmed wall_ms of each and the round it ran in."""

    walls: tuple[np.ndarray, ...]
    rounds: tuple[int, ...]

    @staticmethod
    def of(walls: list[np.ndarray], rounds: list[int]) -> CellRuns:
        keep = [(np.asarray(w, dtype=float), r) for w, r in zip(walls, rounds, strict=True) if len(w) > 0]
        return CellRuns(tuple(w for w, _ in keep), tuple(r for _, r in keep))

    def rates(self) -> np.ndarray:
        return np.array([tok_s(w) for w in self.walls])


def tok_s(wall_ms: np.ndarray) -> float:
    """Tokens per second of one run: number of tokens / their summed wall time."""
    w = np.asarray(wall_ms, dtype=float)
    if w.size == 0 or w.sum() <= 0:
        return float("nan")
    return w.size / (w.sum() / 1000.0)


def trim(wall_ms: np.ndarray, warmup: int) -> np.ndarray:
    return np.asarray(wall_ms, dtype=float)[warmup:]


@lru_cache(maxsize=4096)
def _t(df: float, confidence: float = CONFIDENCE) -> float:
    """Student t's two-sided quantile."""
    return float(stdtrit(df, 0.5 + confidence / 2))


def _log_t(point: float, se_log: float, df: float, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """point * exp(-+ t * se): a t interval on the log scale (se_log: the standard error relative to point)."""
    if not se_log > 0:
        return point, point
    q = _t(df, confidence) * se_log
    return point * math.exp(-q), point * math.exp(q)


def _boot(data: tuple[np.ndarray, ...], statistic, seed: int) -> tuple[float, float]:
    res = sps.bootstrap(data, statistic, n_resamples=N_RESAMPLES, confidence_level=CONFIDENCE, method=METHOD,
                        vectorized=True, paired=False, rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def _tokens_rate(w: np.ndarray, axis: int = -1) -> np.ndarray:
    return 1000.0 / np.mean(w, axis=axis)


def _within_run(point: float, wa: np.ndarray, wb: np.ndarray | None, seed: int) -> Interval:
    """One run (on either side): the spread within it, a bootstrap over its tokens; not a 95% CI."""
    n = int(wa.size if wb is None else min(wa.size, wb.size))
    if wa.size < 2 or wb is not None and wb.size < 2:
        return Interval(point, point, point, "tokens", n, ONE_RUN)
    if wb is None:
        lo, hi = _boot((wa,), _tokens_rate, seed)
    else:
        lo, hi = _boot((wa, wb), lambda x, y, axis=-1: np.mean(y, axis=axis) / np.mean(x, axis=axis), seed)
    return Interval(point, lo, hi, "tokens", n, ONE_RUN)


def cell_interval(runs: list[np.ndarray] | CellRuns, seed: int) -> Interval | None:
    """runs: trimmed wall_ms per successful run of one cell. Mean tok/s over runs with its t interval."""
    if not isinstance(runs, CellRuns):
        runs = CellRuns.of(list(runs), list(range(len(runs))))
    if not runs.walls:
        return None
    if len(runs.walls) == 1:
        w = runs.walls[0]
        return _within_run(tok_s(w), w, None, seed)
    rates = runs.rates()
    n, m = rates.size, float(rates.mean())
    se = float(rates.std(ddof=1)) / m / math.sqrt(n)
    lo, hi = _log_t(m, se, n - 1)
    return Interval(m, lo, hi, "runs", n, T_RUNS, se_log=se, df=n - 1)


def _unpaired(ra: np.ndarray, rb: np.ndarray) -> Interval:
    """Ratio of means, Welch t on the log scale (delta method), each cell's runs on their own."""
    ma, mb = float(ra.mean()), float(rb.mean())
    va, vb = ra.var(ddof=1) / ma**2 / ra.size, rb.var(ddof=1) / mb**2 / rb.size
    se2 = va + vb
    # Welch-Satterthwaite degrees of freedom, floored to 0.01 (conservative; and _t's cache then hits)
    df = math.floor(100 * se2**2 / (va**2 / (ra.size - 1) + vb**2 / (rb.size - 1))) / 100 if se2 > 0 else 1.0
    lo, hi = _log_t(ma / mb, math.sqrt(se2), df)
    return Interval(ma / mb, lo, hi, "runs", int(min(ra.size, rb.size)), T_UNPAIRED, se_log=math.sqrt(se2), df=df)


def _paired(ra: np.ndarray, rb: np.ndarray) -> Interval:
    """Ratio of means over rounds where both ran: t over rounds of a_k/mean(a) - b_k/mean(b)."""
    ma, mb = float(ra.mean()), float(rb.mean())
    z = ra / ma - rb / mb
    se = float(z.std(ddof=1)) / math.sqrt(z.size)
    lo, hi = _log_t(ma / mb, se, z.size - 1)
    return Interval(ma / mb, lo, hi, "rounds", int(z.size), T_PAIRED, unpaired=_unpaired(ra, rb), se_log=se,
                    df=z.size - 1)


def ratio_interval(cell_runs: list[np.ndarray] | CellRuns, base_runs: list[np.ndarray] | CellRuns,
                   seed: int) -> Interval | None:
    """Mean tok/s of a cell divided by the base cell's: paired over rounds when at least two rounds have a
    run of both (CellRuns carry the rounds; plain lists are taken as unpaired), else unpaired over runs,
    else (one run on a side) the within-run spread."""
    a = cell_runs if isinstance(cell_runs, CellRuns) else CellRuns.of(list(cell_runs), [-1] * len(cell_runs))
    b = base_runs if isinstance(base_runs, CellRuns) else CellRuns.of(list(base_runs), [-2] * len(base_runs))
    if not a.walls or not b.walls:
        return None
    common = sorted((set(a.rounds) & set(b.rounds)) - {-1, -2})
    if len(common) >= 2 and len(set(a.rounds)) == len(a.rounds) and len(set(b.rounds)) == len(b.rounds):
        ia, ib = {r: i for i, r in enumerate(a.rounds)}, {r: i for i, r in enumerate(b.rounds)}
        ra = np.array([tok_s(a.walls[ia[r]]) for r in common])
        rb = np.array([tok_s(b.walls[ib[r]]) for r in common])
        return _paired(ra, rb)
    if len(a.walls) >= 2 and len(b.walls) >= 2:
        return _unpaired(a.rates(), b.rates())
    wa, wb = np.concatenate(a.walls), np.concatenate(b.walls)
    return _within_run(float(wb.mean() / wa.mean()), wa, wb, seed)


def precision_reached(ratios: list[Interval | None], half_width: float) -> bool:
    """Every ratio's sequential interval within +-half_width of its point (a missing one never is)."""
    return all(r is not None and r.sequential().half_width <= half_width for r in ratios)


PRECISE = "precise"
AT_MAX = "max"
NO_RUNS = "no-runs"  # a cell had no usable run in two or more rounds: no interval will come from more of them
NO_RUNS_AFTER = 2  # rounds


def precision_decision(ratios: list[Interval | None], rounds: int, half_width: float, min_rounds: int,
                       max_rounds: int, usable: Sequence[int] = ()) -> str | None:
    """Repeats driven by precision, after `rounds` whole rounds: PRECISE (every ratio within +-half_width),
    AT_MAX (the maximum ran), NO_RUNS (a cell, base included, has no usable run after NO_RUNS_AFTER rounds or
    more: its runs fail, so rounds would be added to the maximum for nothing), or None: add a round. `usable`:
    each cell's count of usable runs. Nothing else stops before the minimum."""
    if rounds >= NO_RUNS_AFTER and any(n == 0 for n in usable):
        return NO_RUNS
    if rounds < min_rounds:
        return None
    if precision_reached(ratios, half_width):
        return PRECISE
    return AT_MAX if rounds >= max_rounds else None


def printed(ratio: Interval | None, decision: str | None) -> Interval | None:
    """A ratio's interval as printed: sequential (wider) when its campaign stopped once precise."""
    return ratio.sequential() if ratio is not None and decision == PRECISE else ratio


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
    basis = ("one run: the spread between runs is unknown, so it has no interval" if n_ok == 1
             else "its 95% interval over 2 runs rests on one degree of freedom and is wide")
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
