"""Median [min, max] per cell of chosen `# summary` keys over a campaign folder's runs: the figures a campaign's
findings.md does not tabulate, such as what --recycle-pages changes (the lanes' kernel CPU per MiB read, the page
pool's counts, the mappings). `python -m harness.engine.diag.summary_keys FOLDER [KEY ...]`; a cell's runs are
`runs/r<round>-c<cell>/metrics.csv`."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from harness.formats.folder import METRICS_FILE
from harness.formats.metrics_csv import read_metrics

KEYS = ("lanes_sys_ms_per_mib", "lanes_sys_ms", "releaser_cpu_ms", "main_cpu_ms", "vmas", "max_map_count",
        "rss_shmem_mib", "cgroup_usage_mib", "peak_rss_mib", "pool_mib", "pool_recycled", "pool_fresh",
        "pool_fallback", "pool_dontneed", "pool_errors", "n_decode", "decode_tok_s")


def cells(folder: Path) -> dict[str, list[dict[str, float]]]:
    """cell id -> the last summary of each of its runs that finished."""
    out: dict[str, list[dict[str, float]]] = {}
    for run in sorted(p for p in (folder / "runs").iterdir() if p.is_dir() and not p.name.startswith(".")):
        csv = run / METRICS_FILE
        if csv.is_file():
            out.setdefault(run.name.split("-")[-1], []).append(read_metrics(csv).summary())
    return out


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or not (Path(args[0]) / "runs").is_dir():
        raise SystemExit("usage: python -m harness.engine.diag.summary_keys FOLDER [KEY ...] (a campaign folder)")
    keys = args[1:] or list(KEYS)
    for cell, runs in cells(Path(args[0])).items():
        print(f"{cell}: {len(runs)} runs")
        for k in keys:
            v = [r[k] for r in runs if k in r]
            if v:
                print(f"  {k}: {statistics.median(v):.4g} [{min(v):.4g}, {max(v):.4g}]")
        per_tok = [r["main_cpu_ms"] / r["n_decode"] for r in runs if "main_cpu_ms" in r and r.get("n_decode")]
        if per_tok:
            print(f"  main_cpu_ms per token: {statistics.median(per_tok):.4g} [{min(per_tok):.4g}, {max(per_tok):.4g}]")


if __name__ == "__main__":
    main()
