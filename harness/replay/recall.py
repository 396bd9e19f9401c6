"""The early router's recall per layer, from the `# summary` lines of --predict-prefetch runs' metrics CSVs
(`predict_agree_l<L>`: named experts the layer then used / named), averaged over runs (each run's decode tokens
weigh alike), beside chance (k/E), with the MiB of speculative reads wasted per decode token. Pure over read files."""

from __future__ import annotations

import re
from pathlib import Path

from harness.formats.metrics_csv import read_metrics

_L = re.compile(r"predict_agree_l(\d+)$")


def recall_table(label: str, csvs: list[Path], chance: float) -> list[dict[str, str]]:
    per: dict[int, list[float]] = {}
    wasted, tokens, allv = 0.0, 0, []
    for p in csvs:
        m = read_metrics(p)
        s = m.summary()
        for k, v in s.items():
            hit = _L.match(k)
            if hit and v >= 0:
                per.setdefault(int(hit.group(1)), []).append(v)
        if s.get("predict_agree", -1) >= 0:
            allv.append(s["predict_agree"])
        wasted += s.get("prefetch_wasted_mib", 0.0)
        tokens += int(len(m.rows))
    rows = [{"model": label, "layer": str(la), "recall_pct": f"{100 * sum(v) / len(v):.1f}",
             "runs": str(len(v)), "chance_pct": f"{100 * chance:.1f}"} for la, v in sorted(per.items())]
    rows.append({"model": label, "layer": "all", "recall_pct": f"{100 * sum(allv) / len(allv):.1f}" if allv else "",
                 "runs": str(len(allv)), "chance_pct": f"{100 * chance:.1f}",
                 "wasted_mib_per_token": f"{wasted / tokens:.4f}" if tokens else ""})
    return rows


def markdown(rows: list[dict[str, str]]) -> str:
    out = ["| model | layer | early-router recall | chance (k/E) | runs | wasted MiB / token |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['model']} | {r['layer']} | {r['recall_pct']}% | {r['chance_pct']}% | {r['runs']} | "
                   f"{r.get('wasted_mib_per_token', '')} |")
    return "\n".join(out) + "\n"
