"""How intervals read in findings.md (pure): one figure with its 95% interval, or a single run's figure with
its within-run spread said as such; the note naming each interval's method; how much pairing over rounds
narrowed each ratio; and a campaign with `precision:`: which cells reached it and which stopped at the
maximum."""

from __future__ import annotations

import math

from harness import stats
from harness.report.results import Results
from harness.stats import Interval

_HOW = {
    stats.T_RUNS: "tok/s: mean of per-run tok/s, t interval over runs on the log scale (Student t, n-1 degrees "
                  "of freedom)",
    stats.T_PAIRED: "x base: ratio of mean tok/s, paired over rounds (t over the rounds where both ran of each "
                    "round's deviations from the two means: what a round shares, drift or load, cancels)",
    stats.T_UNPAIRED: "x base: ratio of mean tok/s, unpaired (Welch t on the log scale over each cell's own "
                      "runs): fewer than two rounds where both ran, so no pairing",
    stats.ONE_RUN: "one run: the spread between runs is unknown, so no interval; shown instead is the spread "
                   "within that run (a percentile bootstrap over its tokens, 4000 resamples, seeded), which "
                   "says nothing of another run",
    stats.SEQUENTIAL: "the campaign added rounds until every ratio was precise and stopped there: its ratios' "
                      "intervals use t at 99%, which with that stopping rule holds the truth at least 95% of "
                      "the time (stopping when the runs happened to agree makes a plain 95% interval too short)",
}


def fmt(iv: Interval | None, nd: int = 2, unit: str = "") -> str:
    """`4.20 [3.90, 4.52]`, or a single run's `4.20 (one run: spread between runs unknown; within it 4.1-4.3)`."""
    if iv is None or not math.isfinite(iv.point):
        return "n/a"
    if iv.between_runs:
        return f"{iv.point:.{nd}f}{unit} [{iv.low:.{nd}f}, {iv.high:.{nd}f}]"
    return f"{iv.point:.{nd}f}{unit} ({stats.ONE_RUN}; within it {iv.low:.{nd}f}-{iv.high:.{nd}f})"


def methods_note(res: Results) -> str:
    """The table's note: every method its intervals use, named as results.csv names them."""
    used = {iv.method for c in res.cells for iv in (c.tok_s, c.ratio) if iv is not None}
    parts = [_HOW[m] for m in _HOW if any(u.split(", ")[0] == m for u in used)]
    if any(stats.SEQUENTIAL in u for u in used):
        parts.append(_HOW[stats.SEQUENTIAL])
    return ("95% intervals (results.csv's `ci_method` and `ratio_method` name each): " + "; ".join(parts) + "."
            if parts else "")


def pairing_lines(res: Results) -> list[str]:
    """How much pairing over rounds narrowed each ratio's interval (width paired / width unpaired)."""
    rows = [c for c in res.cells if c.ratio is not None and c.ratio.unpaired is not None]
    if not rows:
        return []
    out = ["### Pairing over rounds", "",
           "Each ratio is paired within rounds (every cell runs once a round). Beside it, the unpaired interval "
           "of the same runs: below 100% pairing narrowed it (a round's shared drift cancelled); above, the "
           "rounds shared little and pairing cost degrees of freedom (n-1 instead of up to 2n-2).", "",
           f"| cell | rounds | x {res.ratio_base}, paired [95%] | unpaired [95%] | width paired / unpaired |",
           "|---|---|---|---|---|"]
    for c in rows:
        r, u = c.ratio, c.ratio.unpaired
        out.append(f"| {c.label} | {r.n} | {fmt(r, 2, 'x')} | {fmt(u, 2, 'x')} | {pairing_share(r)} |")
    return out + [""]


def pairing_share(r: Interval | None) -> str:
    """The width of a paired interval as a share of the unpaired one's over the same runs ('n/a': unpaired)."""
    u = r.unpaired if r is not None else None
    if u is None or not u.high > u.low:
        return "n/a"
    return f"{(r.high - r.low) / (u.high - u.low):.0%}"


def _why_not(decision: str | None) -> str:
    return {stats.AT_MAX: "no: stopped at the maximum", stats.NO_RUNS: "no: stopped, a cell had no usable run"
            }.get(decision or "", "not yet")


def precision_lines(res: Results) -> list[str]:
    """A campaign with `precision:`: the rule, the rounds, and per cell whether it reached the precision."""
    p = res.precision
    if p is None:
        return []
    how = {stats.PRECISE: f"stopped after {p.rounds} rounds: every ratio reached the precision",
           stats.AT_MAX: f"stopped at the maximum, {p.rounds} rounds",
           stats.NO_RUNS: f"stopped after {p.rounds} rounds: a cell had no usable run (every run of it failed), so no "
                          "more rounds could give its interval",
           None: f"unfinished after {p.rounds} rounds"}[p.decision]
    out = ["### Precision", "",
           f"Repeats driven by precision: rounds added from {p.min_rounds} until every ratio to the base is "
           f"within +-{100 * p.half_width:g}% (its interval at 99%, see above), at most {p.max_rounds}: {how}.", "",
           f"| cell | x {res.ratio_base} | half-width | reached |", "|---|---|---|---|"]
    for c in res.cells:
        if res.is_base(c):
            continue
        seq = c.ratio.sequential() if c.ratio is not None else None
        hw = seq.half_width if seq is not None else math.inf
        ok = hw <= p.half_width
        out.append(f"| {c.label} | {fmt(c.ratio, 2, 'x')} | "
                   f"{'n/a' if not math.isfinite(hw) else f'+-{hw:.1%} (at 99%)'} | "
                   f"{'yes' if ok else _why_not(p.decision)} |")
    return out + [""]
