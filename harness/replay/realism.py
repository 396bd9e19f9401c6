"""How real a model's routing looks, from its route trace: the measures issue 33 sets a trained model's routing
beside real 30B/120B traces and a random-weight model by. Pure: rows in, numbers out.

Per phase (prefill: the prompt's tokens, teacher-forced; decode: generated tokens), over tokens in order:
- skew: per layer, the share of routings the most-used 10% of experts (ceil(E/10)) take; uniform routing gives
  about 10% (more on short traces: sampling noise favours whichever experts came up).
- reuse distance: for each routing of (layer, expert) after its first, the tokens since that expert's last use in
  that layer; uniform routing gives a geometric distance with mean E/k.
- previous-token share: the share of a token's experts in a layer that the previous token also used there;
  chance is k/E.
- LRU hits at budgets of m token cycles (m x one token's experts over all layers), decode lookups only, replayed
  through the engine's own cache (harness.replay.simulate); budgets are capped at the model's whole expert set."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from harness.formats.route_trace import DECODE, PREFILL, RouteTraceFile
from harness.replay.simulate import replay
from harness.replay.trace import batches

CYCLES = (1, 2, 4)


@dataclass(frozen=True)
class PhaseStats:
    phase: str
    tokens: int
    skew_top10_pct: float  # mean over layers
    skew_top10_min: float
    skew_top10_max: float
    reuse_median: float
    reuse_mean: float
    reuse_within_1_pct: float  # share of reuses at distance 1
    prev_share_pct: float
    chance_prev_pct: float  # k/E
    skew_uniform_pct: float  # the skew uniform routing shows over as many tokens (seeded simulation, 20 layers' worth)
    reuse_uniform_mean: float  # the mean reuse distance uniform routing shows over as many tokens (same simulation)


def tokens_by_layer(f: RouteTraceFile, phase: int) -> list[dict[int, tuple[int, ...]]]:
    """One dict per token of the phase, in order: layer -> the token's experts there (dropped ones left out)."""
    out: dict[tuple[int, int], dict[int, list[int]]] = {}
    for r in f.rows:
        if r.phase != phase or r.dropped:
            continue
        out.setdefault((r.turn, r.step), {}).setdefault(r.layer, []).append(r.expert)
    return [{la: tuple(es) for la, es in out[key].items()} for key in sorted(out)]


def phase_stats(f: RouteTraceFile, phase: int) -> PhaseStats | None:
    toks = tokens_by_layer(f, phase)
    if len(toks) < 2:
        return None
    n_e, k = f.header.n_expert, f.header.k
    layers = sorted({la for t in toks for la in t})
    top = max(1, math.ceil(n_e / 10))
    skews: list[float] = []
    dists: list[int] = []
    prev_hits = prev_total = 0
    for la in layers:
        counts = np.zeros(n_e, dtype=np.int64)
        last: dict[int, int] = {}
        prev: tuple[int, ...] | None = None
        for t, tok in enumerate(toks):
            cur = tok.get(la)
            if cur is None:
                prev = None
                continue
            for e in cur:
                counts[e] += 1
                if e in last:
                    dists.append(t - last[e])
                last[e] = t
            if prev is not None:
                prev_hits += len(set(cur) & set(prev))
                prev_total += len(cur)
            prev = cur
        if counts.sum():
            skews.append(100.0 * np.sort(counts)[::-1][:top].sum() / counts.sum())
    d = np.asarray(dists, dtype=np.float64)
    return PhaseStats(
        phase="prefill" if phase == PREFILL else "decode", tokens=len(toks),
        skew_top10_pct=float(np.mean(skews)), skew_top10_min=float(np.min(skews)), skew_top10_max=float(np.max(skews)),
        reuse_median=float(np.median(d)) if d.size else math.nan, reuse_mean=float(d.mean()) if d.size else math.nan,
        reuse_within_1_pct=100.0 * float((d == 1).mean()) if d.size else math.nan,
        prev_share_pct=100.0 * prev_hits / prev_total if prev_total else math.nan,
        chance_prev_pct=100.0 * k / n_e, **dict(zip(("skew_uniform_pct", "reuse_uniform_mean"),
                                                    uniform_baseline(n_e, k, len(toks)), strict=True)))


def uniform_baseline(n_expert: int, k: int, tokens: int, layers: int = 20, seed: int = 0) -> tuple[float, float]:
    """(top-10% share, mean reuse distance) that uniform routing gives over `tokens` tokens (k distinct experts
    each), over `layers` simulated layers: what a trace of that length is read against (a short trace truncates
    long distances and lets chance favour a few experts)."""
    rng = np.random.default_rng(seed)
    top = max(1, math.ceil(n_expert / 10))
    shares, dists = [], []
    for _ in range(layers):
        picks = np.argsort(rng.random((tokens, n_expert)), axis=1)[:, :k]
        counts = np.bincount(picks.ravel(), minlength=n_expert)
        shares.append(100.0 * np.sort(counts)[::-1][:top].sum() / counts.sum())
        last: dict[int, int] = {}
        for t in range(tokens):
            for e in picks[t]:
                if int(e) in last:
                    dists.append(t - last[int(e)])
                last[int(e)] = t
    return float(np.mean(shares)), float(np.mean(dists)) if dists else math.nan


def lru_hits(f: RouteTraceFile, cycles: tuple[int, ...] = CYCLES) -> dict[int, float]:
    """Decode hit % of the engine's LRU at m token cycles of budget (m capped so the budget stays below the whole
    expert set, where every policy hits everything after warm-up)."""
    trace = batches(f)
    whole = sum(b * f.header.n_expert for b in f.header.expert_bytes if b)
    out: dict[int, float] = {}
    for m in cycles:
        budget = m * trace.cycle_bytes
        if budget >= whole:
            continue
        out[m] = replay(trace, "lru", budget).decode_hit_pct
    return out


def all_stats(f: RouteTraceFile) -> dict[str, object]:
    return {"name": f.name, "arch": f.header.arch, "n_layer": f.header.n_layer, "n_expert": f.header.n_expert,
            "k": f.header.k, "cycles_in_whole_set": f.header.n_expert / f.header.k,
            "phases": [s for s in (phase_stats(f, PREFILL), phase_stats(f, DECODE)) if s is not None],
            "lru": lru_hits(f)}
