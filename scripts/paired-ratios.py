#!/usr/bin/env python3
"""Every cell of a campaign folder against another cell than its base, with the same paired interval findings.md
prints for x base (harness.stats.ratio_interval: paired t over rounds): for a question the campaign's base does not
answer, e.g. read-ahead against the same cache without it. Reads the folder, writes nothing.

    .venv/bin/python scripts/paired-ratios.py bench-data/2026-12-05-readahead-bench cache32
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import stats  # noqa: E402
from harness.errors import UserError  # noqa: E402
from harness.report.collect import load_campaign_data  # noqa: E402


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: scripts/paired-ratios.py FOLDER CELL", file=sys.stderr)
        return 2
    try:
        d = load_campaign_data(argv[0])
    except UserError as e:
        print(f"paired-ratios: {e}", file=sys.stderr)
        return 2
    labels = [c.label for c in d.cells]
    if argv[1] not in labels:
        print(f"paired-ratios: {argv[0]} has no cell {argv[1]!r}: one of {', '.join(labels)}", file=sys.stderr)
        return 2

    def runs(label: str) -> stats.CellRuns:
        c = next(c for c in d.cells if c.label == label)
        ok = [r for r in d.cell_runs(c.index) if r.ok]
        return stats.CellRuns.of([r.metrics.wall_ms(d.warmup) for r in ok], [r.rec.round for r in ok])

    base = runs(argv[1])
    for i, c in enumerate(d.cells):
        if c.label == argv[1]:
            continue
        iv = stats.ratio_interval(runs(c.label), base, d.plan.seed + 1000 * i + 1)
        if iv is None:
            print(f"{c.label} / {argv[1]}: no interval (too few runs)")
        else:
            print(f"{c.label} / {argv[1]}: {iv.point:.3f}x [{iv.low:.3f}, {iv.high:.3f}] ({iv.method})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
