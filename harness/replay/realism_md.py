"""The routing-realism table and findings (bmoe-bench realism): rows from harness.replay.realism, text out. Pure."""

from __future__ import annotations

import math

from harness.replay.realism import CYCLES

COLUMNS = ["trace", "arch", "layers", "experts", "k", "phase", "tokens", "skew_top10_pct", "skew_uniform_pct",
           "skew_min_pct", "skew_max_pct", "reuse_median", "reuse_mean", "reuse_uniform_mean", "reuse_at_1_pct",
           "prev_share_pct", "prev_chance_pct", *[f"lru_{m}T_hit_pct" for m in CYCLES]]


def _f(v: float, nd: int = 1) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{nd}f}"


def rows(stats: list[dict]) -> list[dict[str, str]]:
    out = []
    for s in stats:
        for p in s["phases"]:
            out.append({
                "trace": s["name"], "arch": s["arch"], "layers": str(s["n_layer"]), "experts": str(s["n_expert"]),
                "k": str(s["k"]), "phase": p.phase, "tokens": str(p.tokens),
                "skew_top10_pct": _f(p.skew_top10_pct), "skew_uniform_pct": _f(p.skew_uniform_pct),
                "skew_min_pct": _f(p.skew_top10_min), "skew_max_pct": _f(p.skew_top10_max),
                "reuse_median": _f(p.reuse_median), "reuse_mean": _f(p.reuse_mean),
                "reuse_uniform_mean": _f(p.reuse_uniform_mean), "reuse_at_1_pct": _f(p.reuse_within_1_pct),
                "prev_share_pct": _f(p.prev_share_pct), "prev_chance_pct": _f(p.chance_prev_pct),
                **{f"lru_{m}T_hit_pct": (_f(s["lru"][m]) if p.phase == "decode" and m in s["lru"] else "")
                   for m in CYCLES}})
    return out


def to_csv(table: list[dict[str, str]]) -> str:
    lines = [",".join(COLUMNS)]
    lines += [",".join(r[c] for c in COLUMNS) for r in table]
    return "\n".join(lines) + "\n"


def markdown(table: list[dict[str, str]]) -> str:
    head = ["trace", "phase", "tokens", "E, k", "top-10% share (uniform)", "reuse median / mean (uniform mean)",
            "at distance 1", "prev-token share (chance)", *[f"LRU {m}T" for m in CYCLES]]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in table:
        out.append("| " + " | ".join([
            r["trace"], r["phase"], r["tokens"], f"{r['experts']}, {r['k']}",
            f"{r['skew_top10_pct']}% ({r['skew_uniform_pct']}%)",
            f"{r['reuse_median']} / {r['reuse_mean']} ({r['reuse_uniform_mean']})", f"{r['reuse_at_1_pct']}%",
            f"{r['prev_share_pct']}% ({r['prev_chance_pct']}%)",
            *[(r[f"lru_{m}T_hit_pct"] + "%") if r[f"lru_{m}T_hit_pct"] else "" for m in CYCLES]]) + " |")
    return "\n".join(out) + "\n"
