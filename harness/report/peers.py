"""A campaign's engines axis (pure): each engine's run configuration read from its CSV preamble in one
shared vocabulary, the check that the cells of one setting differ only by the engine, and the ratio of
every engine to the reference engine at every setting.

bmoe writes `cfg.<field>=` lines plus resolved facts (`dense_weights=`, `cache_budget_bytes=`,
`cache_policy_active=`); the C++ original writes several `key=value` per line (`threads= n_ctx= cache_mb=
io_threads= o_direct= dense_weights= ...`). `comparable()` maps both onto the keys of `KEYS`. A key only
one engine records is not compared (it is listed as unchecked instead); a key both record must agree."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath

from harness import stats
from harness.errors import UserError
from harness.report.collect import CampaignData, RunData
from harness.report.intervals import fmt, pairing_share
from harness.stats import Interval

# the shared vocabulary: what a setting is, whichever engine ran it
KEYS = ("model", "threads", "n_ctx", "moe_stream", "cache_mib", "cache_policy", "io_threads", "o_direct",
        "dense_weights", "n_expert_used", "temp", "chatml", "prefetch", "predict_prefetch", "route_ahead",
        "drop_cold_frac", "load_all", "n_prompt", "n_decode")
LRU = "lru"  # the C++ original's only cache policy


def _b(v: str | None) -> str | None:
    """A boolean as 0/1, however the engine spelt it."""
    if v is None:
        return None
    return "1" if v.strip().lower() in ("1", "true", "on", "yes") else "0"


def _num(v: str | None) -> str | None:
    if v is None or v in ("None", ""):
        return None
    try:
        x = float(v)
    except ValueError:
        return v
    return str(int(x)) if x == int(x) else f"{x:g}"


def _bmoe(meta: dict[str, str], summ: dict[str, str]) -> dict[str, str | None]:
    cache_b = meta.get("cache_budget_bytes")
    cache = _num(meta.get("cfg.cache_mb")) if cache_b in (None, "None") else _num(str(round(float(cache_b) / 2**20)))
    k = _num(meta.get("cfg.n_expert_used"))
    return {
        "model": PurePath(meta.get("model_file", meta.get("cfg.model", ""))).name or None,
        "threads": _num(meta.get("cfg.threads")), "n_ctx": _num(meta.get("cfg.ctx")),
        "moe_stream": _b(meta.get("cfg.moe_stream")), "cache_mib": cache,
        "cache_policy": meta.get("cache_policy_active") if cache not in (None, "0") else None,
        "io_threads": _num(meta.get("cfg.io_threads")), "o_direct": _b(meta.get("cfg.odirect")),
        "dense_weights": meta.get("dense_weights") or meta.get("cfg.dense_weights"),
        "n_expert_used": _num(summ.get("k_effective")) or (k if k not in (None, "0") else
                                                           _num(meta.get("n_expert_used_model"))),
        "temp": _num(meta.get("cfg.temp")), "chatml": _b(meta.get("cfg.chatml")),
        # a knob absent from the preamble did not exist in that build: off
        "prefetch": _num(meta.get("cfg.prefetch", "0")), "predict_prefetch": _b(meta.get("cfg.predict_prefetch", "0")),
        "route_ahead": _num(meta.get("cfg.route_ahead", "0")),
        "drop_cold_frac": _num(meta.get("cfg.drop_cold_experts", "0")), "load_all": "0",
    }


def _cxx(meta: dict[str, str], summ: dict[str, str]) -> dict[str, str | None]:
    auto = _b(meta.get("cache_auto")) == "1"
    cache = _num(summ.get("cache_budget_MiB")) if auto else _num(meta.get("cache_mb"))
    return {
        "model": PurePath(meta.get("model", "")).name or None,
        "threads": _num(meta.get("threads")), "n_ctx": _num(meta.get("n_ctx")),
        "moe_stream": _b(meta.get("moe_stream")), "cache_mib": cache,
        "cache_policy": LRU if cache not in (None, "0") else None,
        "io_threads": _num(meta.get("io_threads")), "o_direct": _b(meta.get("o_direct")),
        "dense_weights": meta.get("dense_weights"), "n_expert_used": _num(meta.get("n_expert_used")),
        "temp": _num(meta.get("temp")), "chatml": _b(meta.get("chatml")), "prefetch": _num(meta.get("prefetch")),
        "predict_prefetch": _b(meta.get("predict_prefetch")), "route_ahead": _num(meta.get("route_ahead")),
        "drop_cold_frac": _num(meta.get("drop_cold_frac")), "load_all": _b(meta.get("load_all")),
    }


def comparable(r: RunData) -> dict[str, str | None]:
    """One run's setting in the shared vocabulary (None: the engine did not record it)."""
    assert r.metrics is not None
    meta = r.metrics.meta
    summ = r.metrics.summaries[-1] if r.metrics.summaries else {}
    out = _bmoe(meta, summ) if meta.get("engine") == "bmoe" else _cxx(meta, summ)
    out["n_prompt"] = _num(summ.get("n_prompt"))
    out["n_decode"] = str(len(r.metrics.rows))
    return out


def engine_problems(data: CampaignData) -> list[str]:
    """Every pair of cells of one setting whose runs differ in more than the engine, as one line each."""
    if not data.plan.engines:
        return []
    by_cell: dict[int, dict[str, str | None]] = {}
    for c in data.cells:
        ok = [r for r in data.cell_runs(c.index) if r.ok]
        if ok:
            by_cell[c.index] = comparable(ok[0])
    out = []
    for c in data.cells:
        if c.setting is None or c.setting == c.index or c.index not in by_cell or c.setting not in by_cell:
            continue
        ref, mine = by_cell[c.setting], by_cell[c.index]
        diff = [f"{k} {ref[k]} vs {mine[k]}" for k in KEYS
                if ref.get(k) is not None and mine.get(k) is not None and ref[k] != mine[k]]
        if diff:
            out.append(f"cells '{data.cells[c.setting].label}' and '{c.label}' differ in more than the engine "
                       f"(from their CSV preambles): {'; '.join(diff)}")
    return out


def check_engines(data: CampaignData) -> None:
    """Refuse (UserError) a campaign whose engine cells differ in more than the engine."""
    bad = engine_problems(data)
    if bad:
        raise UserError(f"{data.folder}: refusing to compare engines: " + " | ".join(bad)
                        + "; pin the differing setting in the campaign (flags, or the engine's own flags/spell)")


def unchecked_keys(data: CampaignData) -> list[str]:
    """Keys of the shared vocabulary that some engine of the campaign does not record (not compared)."""
    miss: set[str] = set()
    for c in data.cells:
        ok = [r for r in data.cell_runs(c.index) if r.ok]
        if ok:
            miss |= {k for k, v in comparable(ok[0]).items() if v is None}
    return sorted(miss)


@dataclass
class EngineRatio:
    setting: str  # the reference cell's label without its engine
    engine: str
    reference: str
    tok_s: Interval | None
    ref_tok_s: Interval | None
    ratio: Interval | None  # the reference / this engine, paired over rounds as any ratio


def engine_ratios(data: CampaignData) -> list[EngineRatio]:
    """For every setting, the reference engine against each other engine: ref tok/s / other tok/s."""
    if not data.plan.engines:
        return []
    ref_label = next(iter(data.plan.engines))
    w, seed = data.warmup, data.plan.seed
    walls = {c.index: stats.CellRuns.of([r.metrics.wall_ms(w) for r in ok], [r.rec.round for r in ok])
             for c in data.cells for ok in [[r for r in data.cell_runs(c.index) if r.ok]]}
    out = []
    for c in data.cells:
        if c.setting is None or c.setting == c.index:
            continue
        ref = data.cells[c.setting]
        s = seed + 7919 * c.index
        out.append(EngineRatio(
            setting=ref.label.removeprefix(f"{ref_label} "), engine=c.engine or "", reference=ref_label,
            tok_s=stats.cell_interval(walls[c.index], s), ref_tok_s=stats.cell_interval(walls[ref.index], s + 1),
            ratio=stats.ratio_interval(walls[ref.index], walls[c.index], s + 2)))
    return out


def _iv(iv: Interval | None, unit: str = "") -> str:
    return fmt(iv, 2, unit)


def engines_section(data: CampaignData) -> list[str]:
    """The findings.md section: one row per setting and engine, the reference's ratio to it."""
    rows = engine_ratios(data)
    if not rows:
        return []
    ref = rows[0].reference
    L = ["## Engines side by side", "",
         f"Each setting ran on every engine; the ratio is {ref}'s tok/s over the other engine's at the same "
         f"setting (95% interval, paired over rounds as every ratio here). The CSV preambles were checked: the "
         f"cells of one setting differ only by the engine in "
         + ", ".join(k for k in KEYS if k not in unchecked_keys(data)) + ".", ""]
    un = unchecked_keys(data)
    if un:
        L += [f"Not recorded by every engine, so not checked: {', '.join(un)}.", ""]
    L += [f"| setting | {ref} tok/s | engine | its tok/s | {ref} / it | width paired / unpaired |",
          "|---|---|---|---|---|---|"]
    L += [f"| {r.setting} | {_iv(r.ref_tok_s)} | {r.engine} | {_iv(r.tok_s)} | {_iv(r.ratio, 'x')} | "
          f"{pairing_share(r.ratio)} |" for r in rows]
    return L + [""]
