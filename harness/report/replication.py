"""A replicating campaign's findings (campaign key `replicate:`): the headline comparison in each try, its spread
over the tries and whether it replicated (harness.report.replicate_stats), from the folder's raw data alone.

The headline comparison is what the results table's "x base" column gives: each cell's mean tok/s over its base
cell's, paired over rounds (harness.stats.ratio_interval), here on the runs of one try at a time. Its base is the
base cell on the same device: in a compare fleet, each device's own base cell (never another device's); on one
target, or a spread fleet (every device shares the matrix's runs), the campaign's base cell."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from harness import stats
from harness.report.collect import CampaignData
from harness.report.intervals import fmt
from harness.report.replicate_stats import REPLICATED, Comparison, Verdict, verdict


@dataclass(frozen=True)
class Replication:
    comparisons: list[Comparison]
    intervals: list[list[stats.Interval | None]]  # per comparison, per try
    verdict: Verdict
    gaps_s: list[float | None]  # per try after the first: from the last run of the try before to its first run


def _groups(data: CampaignData) -> list[tuple[str | None, int, list[int]]]:
    """(device or None, base cell index, the other cells' indices) per device of a compare fleet, else one."""
    by: dict[str | None, list[int]] = {}
    for c in data.cells:
        by.setdefault(c.device, []).append(c.index)
    out = []
    for dev, idx in by.items():
        base = next((i for i in idx if not set(data.cells[i].varied) - {"device"}), None)
        if base is not None:
            out.append((dev, base, [i for i in idx if i != base]))
    return out


def _runs(data: CampaignData, cell: int, k: int) -> stats.CellRuns:
    ok = [r for r in data.cell_runs(cell) if r.ok and r.rec.try_index == k]
    return stats.CellRuns.of([r.metrics.wall_ms(data.warmup) for r in ok], [r.rec.round for r in ok])


def _epoch(iso: str | None) -> float | None:
    try:
        return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() if iso else None
    except ValueError:
        return None


def _gaps(data: CampaignData, tries: int) -> list[float | None]:
    out: list[float | None] = []
    for k in range(1, tries):
        ends = [t for r in data.runs if r.rec.try_index == k - 1 for t in [_epoch(r.rec.end)] if t is not None]
        starts = [t for r in data.runs if r.rec.try_index == k for t in [_epoch(r.rec.start)] if t is not None]
        out.append(min(starts) - max(ends) if ends and starts else None)
    return out


def replication_of(data: CampaignData) -> Replication | None:
    """The replication of a campaign that asked for it (None otherwise)."""
    rep = data.plan.replicate
    if rep is None:
        return None
    seed = data.plan.seed
    comps, ivs = [], []
    for dev, base, others in _groups(data):
        for i in others:
            row = [stats.ratio_interval(_runs(data, i, k), _runs(data, base, k), seed + 1000 * i + 100 + k)
                   for k in range(rep.tries)]
            ivs.append(row)
            label = data.cells[i].label
            base_label = data.cells[base].label
            if dev:  # the device's name is the group's: the cells by their setting
                label, base_label = label.removeprefix(f"{dev} "), base_label.removeprefix(f"{dev} ")
            comps.append(Comparison(dev, label, base_label, tuple(iv.point if iv is not None else None for iv in row),
                                    rep.within_pct))
    return Replication(comps, ivs, verdict(comps, rep.tries, rep.within_pct), _gaps(data, rep.tries))


def tries_note(plan) -> str:
    """After the Setup's repeats: ` per try, 5 tries 300 s apart` when the campaign replicates."""
    rep = plan.replicate
    return "" if rep is None else f" per try, {rep.tries} tries {rep.wait_s:g} s apart (Replication below)"


def _pct(x: float) -> str:
    return "n/a" if x != x else f"{x:.2f}%"


def verdict_lines(r: Replication | None) -> list[str]:
    """Under the Verdict heading: one sentence."""
    if r is None:
        return []
    v = r.verdict
    text = v.line().removeprefix("replicate: ")
    return [f"**Replication**: {text[0].upper()}{text[1:]}; see Replication below.", ""]


def section(data: CampaignData, r: Replication | None) -> list[str]:
    if r is None:
        return []
    rep = data.plan.replicate
    assert rep is not None
    v = r.verdict
    gaps = [g for g in r.gaps_s if g is not None]
    gap = (f"measured gaps between tries {min(gaps):.1f}-{max(gaps):.1f} s" if gaps else "no gap measured yet")
    out = ["## Replication", "",
           f"Asked (`replicate:`): {rep.tries} tries within {rep.within_pct:g}%, {rep.wait_s:g} s between them "
           f"({gap}). Each try is a separate pass over every cell, {data.plan.repeats} round(s), its runs recorded "
           f"with their try in the manifest. The comparison replicated is the headline one: each cell's mean tok/s "
           f"over its base cell's on the same device (the x base column, paired over the try's rounds; "
           f"[95% CI] within the try). The spread is max/min - 1 over the tries (and (max - min) / median beside "
           f"it); it replicated when max/min - 1 <= {rep.within_pct:g}%.", ""]
    heads = " | ".join(f"try {k + 1}" for k in range(rep.tries))
    dev_col = any(c.device for c in r.comparisons)
    out += [("| device " if dev_col else "") + f"| comparison | {heads} | max/min - 1 | (max-min)/median | verdict |",
            "|" + "---|" * (rep.tries + 4 + dev_col)]
    for c, row in zip(r.comparisons, r.intervals, strict=True):
        cells = " | ".join(fmt(iv, 3, "x") for iv in row)
        state = (f"within {rep.within_pct:g}%" if c.state == REPLICATED else
                 f"NOT within {rep.within_pct:g}%: missed by {c.miss_pp:.2f} pp" if c.complete else
                 f"incomplete: {c.done} of {c.n_tries} tries")
        out.append((f"| {c.device} " if dev_col else "") + f"| {c.cell} / {c.base} | {cells} | "
                   f"{_pct(c.spread_pct)} | {_pct(c.range_median_pct)} | {state} |")
    out += ["", f"**{v.line().removeprefix('replicate: ')[0].upper()}{v.line().removeprefix('replicate: ')[1:]}.**",
            ""]
    return out
