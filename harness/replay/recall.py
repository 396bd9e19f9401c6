"""The early router's recall per layer, from the `# summary` lines of --predict-prefetch runs' metrics CSVs
(`predict_agree_l<L>`: named experts the layer then used / named), averaged over runs (each run's decode tokens
weigh alike), beside chance (k/E), with the MiB of speculative reads wasted per decode token. Pure over read files."""

from __future__ import annotations

from pathlib import Path

from harness.formats.metrics_csv import early_router_recall, read_metrics


def recall_table(label: str, csvs: list[Path], chance: float) -> list[dict[str, str]]:
    per: dict[int, list[float]] = {}
    wasted, tokens, allv = 0.0, 0, []
    for p in csvs:
        m = read_metrics(p)
        whole, layers, waste = early_router_recall(m.summary())
        for la, v in layers.items():
            per.setdefault(la, []).append(v)
        if whole is not None:
            allv.append(whole)
        wasted += waste
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
