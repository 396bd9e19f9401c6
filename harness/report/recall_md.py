"""findings.md's "Early router recall" section: for each cell whose runs ran the early router (--predict-prefetch),
its recall per layer (`predict_agree_l<L>` in the runs' `# summary` lines: named experts the layer then used /
named, over the run's decode tokens), averaged over runs, beside chance (k/E from the preamble) and the speculative
MiB wasted per token. Pure over the folder's parsed metrics."""

from __future__ import annotations

import math

from harness.formats.metrics_csv import early_router_recall
from harness.report.collect import CampaignData


def _chance(meta: dict[str, str]) -> float:
    try:
        e = int(meta.get("n_expert", "0"))
        k = int(meta.get("cfg.n_expert_used", "0")) or int(meta.get("n_expert_used_model", "0"))
    except ValueError:
        return math.nan
    return k / e if e > 0 and k > 0 else math.nan


def _mean(v: list[float]) -> str:
    return f"{100 * sum(v) / len(v):.1f}%" if v else "n/a"


def recall_section(data: CampaignData) -> list[str]:
    cols: list[tuple[str, dict[int, list[float]], list[float], float, float]] = []
    for c in data.cells:
        per: dict[int, list[float]] = {}
        allv: list[float] = []
        wasted, tokens, chance = 0.0, 0, math.nan
        for r in data.cell_runs(c.index):
            if not r.ok or r.metrics is None or not r.metrics.summaries:
                continue
            try:
                s = r.metrics.summary()
            except ValueError:  # a summary field that is not a number: the audit names the run
                continue
            whole, layers, waste = early_router_recall(s)
            if whole is None:
                continue
            allv.append(whole)
            for la, v in layers.items():
                per.setdefault(la, []).append(v)
            wasted += waste
            tokens += len(r.metrics.rows)
            chance = _chance(r.metrics.meta)
        if allv:
            cols.append((c.label, per, allv, wasted / tokens if tokens else math.nan, chance))
    if not cols:
        return []
    layers = sorted({la for _, per, _, _, _ in cols for la in per})
    head = ["layer", *[f"{label}" for label, *_ in cols]]
    out = ["## Early router recall", "",
           "The early router (--predict-prefetch) names each next layer's experts from this layer's MoE input; its "
           "recall is the share of the named experts that layer then used, over each run's decode tokens, averaged "
           "over the cell's runs (the engine's `predict_agree_l<L>` summary fields). Chance is k/E: what naming k "
           "experts at random would hit. Wasted MiB/token: speculative reads evicted unused, per token written.", "",
           "| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for la in layers:
        out.append("| " + " | ".join([str(la)] + [_mean(per.get(la, [])) for _, per, *_ in cols]) + " |")
    out.append("| **all** | " + " | ".join(f"**{_mean(allv)}**" for _, _, allv, _, _ in cols) + " |")
    out.append("| chance (k/E) | " + " | ".join(f"{100 * ch:.1f}%" if math.isfinite(ch) else "n/a"
                                                  for *_, ch in cols) + " |")
    out.append("| wasted MiB/token | " + " | ".join(f"{w:.2f}" if math.isfinite(w) else "n/a"
                                                      for _, _, _, w, _ in cols) + " |")
    out.append("| runs | " + " | ".join(str(len(allv)) for _, _, allv, _, _ in cols) + " |")
    return out + [""]
