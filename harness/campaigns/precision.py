"""Repeats driven by precision (campaign key `precision:`), what the runner needs: the runs a round adds,
and the decision after a round from the folder's finished runs, through the same functions the report
uses (harness.stats: ratio_interval over rounds, precision_decision)."""

from __future__ import annotations

from pathlib import Path

from harness import stats
from harness.campaigns.expand import RunSpec, order_runs
from harness.errors import UserError
from harness.formats.bases import base_cells
from harness.formats.campaign import Precision
from harness.formats.manifest import METRICS_FILE, Manifest, run_dir
from harness.formats.metrics_csv import read_metrics


def round_runs(n_cells: int, rnd: int, order: str, seed: int) -> list[RunSpec]:
    """The runs of round `rnd` (0-based), in the order the first rounds follow (order_runs gives the same
    rounds whatever their number, so round k is the same planned up front or added)."""
    return order_runs(n_cells, rnd + 1, order, seed)[rnd * n_cells:]


def cell_runs(folder: Path, m: Manifest) -> dict[int, stats.CellRuns]:
    """Every cell's usable runs so far: trimmed wall_ms and round (an unreadable CSV: the run is left out,
    as the report leaves it out)."""
    warm = m.campaign.warmup_tokens
    walls: dict[int, tuple[list, list]] = {c.index: ([], []) for c in m.campaign.cells}
    for r in m.runs:
        if r.status != "ok":
            continue
        try:
            mt = read_metrics(run_dir(folder, r.run_id) / METRICS_FILE)
        except UserError:
            continue
        if mt.problem(r.tokens) is None:
            walls[r.cell][0].append(mt.wall_ms(warm))
            walls[r.cell][1].append(r.round)
    return {c: stats.CellRuns.of(w, rd) for c, (w, rd) in walls.items()}


def ratios(runs: dict[int, stats.CellRuns], bases: dict[int, int], seed: int) -> dict[int, stats.Interval | None]:
    """Every cell's ratio to its base (harness.formats.manifest.base_cells), as the report computes it
    (harness.report.results)."""
    return {c: stats.ratio_interval(r, runs[bases[c]], seed + 1000 * c + 1) for c, r in runs.items()
            if c != bases[c] and bases[c] in runs}


def decision(folder: Path, m: Manifest, p: Precision) -> tuple[str | None, dict[int, stats.Interval | None]]:
    """After the folder's last whole round: stats.PRECISE, stats.AT_MAX, stats.NO_RUNS or None (add a round),
    and the ratios it rests on."""
    runs = cell_runs(folder, m)
    rs = ratios(runs, base_cells(m.campaign.cells), m.campaign.seed)
    rounds = 1 + max(r.round for r in m.runs)
    return stats.precision_decision(list(rs.values()), rounds, p.ratio_half_width, p.min_repeats or 2,
                                    p.max_repeats, [len(r.walls) for r in runs.values()]), rs


def describe(p: Precision) -> str:
    return f"every ratio within +-{p.ratio_half_width:.0%}, {p.min_repeats}-{p.max_repeats} rounds"
