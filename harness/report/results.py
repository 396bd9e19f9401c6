"""Per-cell results of a campaign (pure: CampaignData in, dataclasses and rows out): tok/s with its 95%
interval, the ratio to the base cell (paired over rounds), the precision outcome of a campaign with
`precision:`, the s/token split, bytes, hits, memory, faults, and the warnings that name a remedy."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from harness import stats
from harness.formats.bases import base_cells
from harness.formats.devstate import DeviceSample
from harness.report.collect import CampaignData, RunData
from harness.stats import Finding, Interval, RunPoint


@dataclass
class CellResult:
    index: int
    label: str
    varied: dict
    n_runs: int
    n_ok: int
    failures: list[tuple[str, str]]  # (run id, reason)
    tok_s: Interval | None
    ratio: Interval | None  # vs the base cell; None for the base itself
    run_rates: list[float]
    io_s: float  # s/token waiting for expert reads (stall_ms), NaN when unmeasured
    mgmt_s: float  # s/token of cache management
    mgmt_cpu_s: float  # of which the compute thread's own CPU time (NaN where the engine did not measure it)
    mgmt_hidden_s: float  # of which spent beside demand reads the token then waited for (NaN: unmeasured)
    evictor_cpu_s: float  # decode evictions' CPU on the evictor's helper thread, not in mgmt_s (NaN: unmeasured)
    compute_s: float  # s/token residual (wall - stall - mgmt, as the engine writes it)
    wall_s: float  # s/token, mean over kept tokens
    mib_per_tok: float
    hit_pct: float  # cumulative at the last token, mean over runs
    peak_rss_mib: float
    cap_peak_mib: float  # peak of the memory-cap cgroup (page cache included), if capped
    majflt_per_tok: float
    config: dict[str, str] = field(default_factory=dict)  # preamble keys shared by all its runs
    route_agree: float = math.nan  # --route-ahead: mean per-token slot agreement with the true routing (lossy)
    prefetch_mib_per_tok: float = math.nan  # --prefetch / --predict-prefetch: speculative MiB read per token
    prefetch_wasted_pct: float = math.nan  # of the speculative bytes, the share evicted before any use
    draft_per_batch: float = math.nan  # --ngram / --mtp: guesses kept per verify batch that carried guesses
    draft_kept_pct: float = math.nan  # of the guesses made, the share kept


@dataclass
class PrecisionOutcome:
    """A campaign with repeats driven by precision: the rule, the rounds run, and how it ended."""

    half_width: float
    min_rounds: int
    max_rounds: int
    rounds: int
    decision: str | None  # stats.PRECISE, stats.AT_MAX, stats.NO_RUNS, or None: unfinished


@dataclass
class Results:
    cells: list[CellResult]
    base: CellResult
    findings: list[Finding]
    varying_keys: list[str]  # configuration keys (cfg.*, mode) that differ between cells: table columns
    varying_facts: list[str]  # other preamble keys that differ between cells (resolved budgets, ...)
    fixed_config: dict[str, str]  # preamble keys identical in every run
    seed: int
    precision: PrecisionOutcome | None = None
    bases: dict[int, int] = field(default_factory=dict)  # cell index -> its base's (formats.manifest.base_cells)
    ratio_base: str = "base"  # what every ratio is to, as a column says it: "x <ratio_base>"

    def is_base(self, c: CellResult) -> bool:
        """c is a base cell: the base, or in a compare fleet its device's base."""
        return c is self.base or self.bases.get(c.index) == c.index


def _nanmean(parts: list[np.ndarray]) -> float:
    parts = [p for p in parts if p is not None and p.size]
    if not parts:
        return math.nan
    x = np.concatenate(parts)
    return float(np.nanmean(x)) if np.isfinite(x).any() else math.nan


def _col(runs: list[RunData], name: str, warmup: int) -> list[np.ndarray]:
    out = []
    for r in runs:
        c = r.metrics.col(name) if r.metrics is not None else None
        if c is not None:
            out.append(c[warmup:])
    return out


def _share(part: list[np.ndarray], whole: list[np.ndarray]) -> float:
    """100 * sum(part) / sum(whole) over the measured tokens, NaN when nothing was measured or whole is 0."""
    p = np.concatenate(part) if part else np.zeros(0)
    q = np.concatenate(whole) if whole else np.zeros(0)
    keep = np.isfinite(p) & np.isfinite(q)
    total = float(q[keep].sum()) if keep.any() else 0.0
    return 100.0 * float(p[keep].sum()) / total if total > 0 else math.nan


def _per_batch(kept: list[np.ndarray], proposed: list[np.ndarray]) -> float:
    """Guesses kept per verify batch: a verify batch's first token row carries its guesses made and kept (0 made on
    every other row); NaN where no row carried a guess."""
    k = np.concatenate(kept) if kept else np.zeros(0)
    p = np.concatenate(proposed) if proposed else np.zeros(0)
    batches = np.isfinite(p) & np.isfinite(k) & (p > 0)
    return float(k[batches].sum()) / int(batches.sum()) if batches.any() else math.nan


def _last(runs: list[RunData], name: str) -> float:
    vals = []
    for r in runs:
        c = r.metrics.col(name) if r.metrics is not None else None
        if c is not None and c.size and np.isfinite(c[-1]):
            vals.append(float(c[-1]))
    return float(np.mean(vals)) if vals else math.nan


def _max(runs: list[RunData], name: str) -> float:
    vals = [float(np.nanmax(c)) for c in _col(runs, name, 0) if np.isfinite(c).any()]
    return max(vals) if vals else math.nan


def _io_wait(runs: list[RunData], warmup: int) -> list[np.ndarray]:
    """Per-token time waiting for expert reads: stall_ms, except for the C++ engine without its overlap seam
    (preamble overlap=0), whose reads are serial: there the wait is all of io_ms and stall_ms is 0."""
    out = []
    for r in runs:
        serial = r.metrics is not None and r.metrics.meta.get("overlap") == "0"
        out += _col([r], "io_ms" if serial else "stall_ms", warmup)
    return out


# per-run paths and texts, never a cell's configuration (cfg.csv is a temporary path on the target)
_PER_RUN_KEYS = ("csv", "route_trace", "model", "prompt",
                 # a run's own files: they differ by run id, even between cells of a single repeat
                 "cfg.csv", "cfg.replies", "cfg.prompts_file", "cfg.io_trace", "cfg.compute_trace")


def _configs(data: CampaignData) -> tuple[dict[int, dict[str, str]], list[str], dict[str, str]]:
    per_cell: dict[int, list[dict[str, str]]] = {}
    for r in data.runs:
        if r.ok and r.metrics.meta:
            per_cell.setdefault(r.rec.cell, []).append(
                {k: v for k, v in r.metrics.meta.items() if k not in _PER_RUN_KEYS})
    shared: dict[int, dict[str, str]] = {}
    for ci, metas in per_cell.items():
        keys = set.intersection(*[set(m) for m in metas])
        shared[ci] = {k: metas[0][k] for k in sorted(keys) if all(m[k] == metas[0][k] for m in metas)}
    all_keys = sorted(set().union(*[set(s) for s in shared.values()])) if shared else []
    varying, fixed = [], {}
    for k in all_keys:
        vals = {s.get(k) for s in shared.values()}
        if len(vals) > 1:
            varying.append(k)
        else:
            fixed[k] = next(iter(vals))
    return shared, varying, fixed


def freq_fraction(s: DeviceSample | None) -> float | None:
    """The sample's lowest cpufreq ceiling as a fraction of the hardware maximum (stats.freq_fraction)."""
    return stats.freq_fraction(s.dump().get("cpufreq")) if s is not None else None


def _point(r: RunData, warmup: int, cell_label: str) -> RunPoint:
    entry = r.rec.entry_state
    temps = [s.cpu_temp_c for s in r.states if s.cpu_temp_c is not None]
    # a run with its own throttle record is raised next to its cell (harness.report.steady_md), not again here
    fr = [freq_fraction(s) for s in r.states] if r.rec.throttle is None else []
    fr = [f for f in fr if f is not None]
    return RunPoint(cell=cell_label, round=r.rec.round, position=r.rec.position,
                    tok_s=stats.tok_s(r.metrics.wall_ms(warmup)),
                    entry_cpu_temp_c=entry.cpu_temp_c if entry is not None else None,
                    entry_freq_frac=freq_fraction(entry),
                    max_cpu_temp_c=max(temps) if temps else None, min_freq_frac=min(fr) if fr else None)


def compute_results(data: CampaignData) -> Results:
    seed = data.plan.seed
    w = data.warmup
    shared, varying, fixed = _configs(data)
    base_idx = next(c.index for c in data.cells if not c.varied)
    bases = base_cells(data.cells)  # on a compare fleet each device's own base: no ratio between devices
    base_runs = {}
    for b in set(bases.values()):
        ok_b = [r for r in data.cell_runs(b) if r.ok]
        base_runs[b] = stats.CellRuns.of([r.metrics.wall_ms(w) for r in ok_b], [r.rec.round for r in ok_b])
    cells: list[CellResult] = []
    findings: list[Finding] = []
    points: list[RunPoint] = []
    for c in data.cells:
        runs = data.cell_runs(c.index)
        ok = [r for r in runs if r.ok]
        walls = [r.metrics.wall_ms(w) for r in ok]
        cr = stats.CellRuns.of(walls, [r.rec.round for r in ok])
        # each cell gets its own bootstrap stream (one run's within-run spread), derived from the campaign seed
        iv = stats.cell_interval(cr, seed + 1000 * c.index)
        b = bases[c.index]
        ratio = None if c.index == b else stats.ratio_interval(cr, base_runs[b], seed + 1000 * c.index + 1)
        caps = [r.rec.peak_mem_mib for r in ok if r.rec.peak_mem_mib is not None]
        rb = _col(ok, "read_bytes", w)
        failures = [(r.run_id, r.rec.reason or r.problem or "failed") for r in runs
                    if r.rec.finished and not r.ok and r.rec.status != "ok"]
        invalid = [(r.run_id, r.problem or "unusable") for r in runs if r.rec.status == "ok" and not r.ok]
        unusable = failures + [(rid, f"invalid: {why}") for rid, why in invalid]
        cells.append(CellResult(
            index=c.index, label=c.label, varied=c.varied, n_runs=len(runs), n_ok=len(ok),
            failures=unusable, tok_s=iv, ratio=ratio,
            run_rates=[stats.tok_s(x) for x in walls],
            io_s=_nanmean(_io_wait(ok, w)) / 1000, mgmt_s=_nanmean(_col(ok, "mgmt_ms", w)) / 1000,
            mgmt_cpu_s=_nanmean(_col(ok, "mgmt_cpu_ms", w)) / 1000,
            mgmt_hidden_s=_nanmean(_col(ok, "mgmt_hidden_ms", w)) / 1000,
            evictor_cpu_s=_nanmean(_col(ok, "mgmt_bg_cpu_ms", w)) / 1000,
            compute_s=_nanmean(_col(ok, "compute_ms", w)) / 1000, wall_s=_nanmean(walls) / 1000,
            mib_per_tok=_nanmean(rb) / 2**20, hit_pct=_last(ok, "cache_hit_pct"),
            peak_rss_mib=_max(ok, "rss_mib"), cap_peak_mib=max(caps) if caps else math.nan,
            majflt_per_tok=_nanmean(_col(ok, "majflt", w)), config=shared.get(c.index, {}),
            route_agree=_nanmean(_col(ok, "route_agree", w)),
            prefetch_mib_per_tok=_nanmean(_col(ok, "prefetch_bytes", w)) / 2**20,
            prefetch_wasted_pct=_share(_col(ok, "prefetch_wasted_bytes", w), _col(ok, "prefetch_bytes", w)),
            draft_per_batch=_per_batch(_col(ok, "draft_accepted", w), _col(ok, "draft_proposed", w)),
            draft_kept_pct=_share(_col(ok, "draft_accepted", w), _col(ok, "draft_proposed", w)),
        ))
        for f in (stats.few_runs_check(c.label, len(ok)),
                  stats.variance_check(c.label, cells[-1].run_rates)):
            if f is not None:
                findings.append(f)
        if invalid:
            why = "; ".join(f"{rid}: {why}" for rid, why in invalid[:3])
            findings.append(Finding("invalid", f"{c.label}: {len(invalid)} run(s) recorded ok are left out, "
                                    f"their raw files unusable ({why}"
                                    + "): restore them as committed (sha256 in manifest.json), or run the "
                                      "campaign again with --fresh.", c.label))
        if failures:
            findings.append(Finding("failed", f"{c.label}: {len(failures)} run(s) failed ("
                                    + "; ".join(f"{rid}: {why}" for rid, why in failures[:3])
                                    + f"): fix the cause and run `{data.manifest.reproduce} --retry-failed`, "
                                      "with --out the folder that holds this one (finished runs are kept).",
                                    c.label))
        points += [_point(r, w, c.label) for r in ok]
    for f in (stats.drift_check(points), stats.throttle_check(points)):
        if f is not None:
            findings.append(f)
    gave_up = [r.run_id for r in data.runs if r.rec.gate is not None and r.rec.gate.gave_up]
    if gave_up:
        findings.append(Finding("gate", f"the cooldown gate gave up before {len(gave_up)} run(s) "
                                        f"({', '.join(gave_up[:5])}): those started hot or short of memory; "
                                        f"raise cooldown.max_wait_s or cool the device."))
    unchecked = sorted({u for r in data.runs if r.rec.gate is not None for u in r.rec.gate.unchecked})
    if unchecked:
        findings.append(Finding("gate", f"the cooldown gate could not check {', '.join(unchecked)} on this "
                                        f"target: runs were not gated on it."))
    base = next(x for x in cells if x.index == base_idx)
    outcome = precision_outcome(data, [c.ratio for c in cells if bases[c.index] != c.index], [c.n_ok for c in cells])
    if outcome is not None:  # stopped once precise: the ratios as the rule read them (sequential intervals)
        for c in cells:
            c.ratio = stats.printed(c.ratio, outcome.decision)
    cfg = [k for k in varying if k.startswith("cfg.") or k == "mode"]
    if data.plan.engines:  # engines write different preamble keys: cells are named by engine and setting instead
        cfg = []
    return Results(cells=cells, base=base, findings=findings, varying_keys=cfg,
                   varying_facts=[k for k in varying if k not in cfg], fixed_config=fixed, seed=seed,
                   precision=outcome, bases=bases, ratio_base=_ratio_base(data, base_idx))


def _ratio_base(data: CampaignData, base_idx: int) -> str:
    """What the ratios are to: "base"; in a compare fleet the base setting on each cell's own device."""
    c = data.cells[base_idx]
    if c.device is None:
        return "base"
    label = c.label[len(c.device) + 1:] if c.label.startswith(f"{c.device} ") else c.label
    return f"{label or 'base'} on the same device"


def precision_outcome(data: CampaignData, ratios: list[Interval | None], usable: list[int]
                      ) -> PrecisionOutcome | None:
    """How a campaign with `precision:` ended: the decision the runner took after its last round (the same
    function on the same runs), None while runs are pending."""
    p = data.plan.precision
    if p is None:
        return None
    rounds = 1 + max((r.rec.round for r in data.runs), default=-1)
    lo = p.min_repeats or data.plan.repeats
    done = all(r.rec.finished for r in data.runs)
    decision = (stats.precision_decision(ratios, rounds, p.ratio_half_width, lo, p.max_repeats, usable) if done
                else None)
    return PrecisionOutcome(p.ratio_half_width, lo, p.max_repeats, rounds, decision)


def _r(x: float | None, nd: int = 4) -> float | None:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return None
    return round(float(x), nd)


def _between(iv: Interval | None, side: str) -> float | None:
    """An interval's bound for results.csv: none for one run (no interval between runs)."""
    return _r(getattr(iv, side)) if iv is not None and iv.between_runs else None


def results_rows(res: Results) -> list[dict[str, object]]:
    """results.csv's rows (harness.formats.results_csv)."""
    rows = []
    prefetched = any(math.isfinite(c.prefetch_mib_per_tok) for c in res.cells)
    evictor = any(math.isfinite(c.evictor_cpu_s) for c in res.cells)
    guessed = any(math.isfinite(c.draft_per_batch) for c in res.cells)
    for c in res.cells:
        row = {"cell": c.label}
        for k in res.varying_keys:
            row[k] = c.config.get(k)
        row.update({
            "runs_ok": c.n_ok, "runs_failed": len(c.failures),
            "tok_s": _r(c.tok_s.point if c.tok_s else None), "tok_s_lo": _between(c.tok_s, "low"),
            "tok_s_hi": _between(c.tok_s, "high"), "ci_basis": c.tok_s.basis if c.tok_s else None,
            "ci_method": c.tok_s.method if c.tok_s else None,
            "ratio": _r(c.ratio.point if c.ratio else (1.0 if res.is_base(c) else None)),
            "ratio_lo": _between(c.ratio, "low"), "ratio_hi": _between(c.ratio, "high"),
            "ratio_method": c.ratio.method if c.ratio else None,
            "s_per_tok": _r(c.wall_s), "io_wait_s_per_tok": _r(c.io_s), "mgmt_s_per_tok": _r(c.mgmt_s),
            "mgmt_cpu_s_per_tok": _r(c.mgmt_cpu_s), "mgmt_hidden_s_per_tok": _r(c.mgmt_hidden_s),
            "compute_s_per_tok": _r(c.compute_s), "mib_read_per_tok": _r(c.mib_per_tok, 3),
            "hit_pct": _r(c.hit_pct, 2), "peak_rss_mib": _r(c.peak_rss_mib, 1),
            "cap_peak_mib": _r(c.cap_peak_mib, 1), "majflt_per_tok": _r(c.majflt_per_tok, 2),
        })
        if evictor:  # only where the engine measured it (every older folder's results.csv keeps its columns)
            row["evictor_cpu_s_per_tok"] = _r(c.evictor_cpu_s)
        if prefetched:  # only where a cell read ahead (every other folder's results.csv keeps its columns)
            row.update({"prefetch_mib_per_tok": _r(c.prefetch_mib_per_tok, 3),
                        "prefetch_wasted_pct": _r(c.prefetch_wasted_pct, 2)})
        if guessed:  # only where a cell guessed ahead (every other folder's results.csv keeps its columns)
            row.update({"draft_kept_per_batch": _r(c.draft_per_batch, 3), "draft_kept_pct": _r(c.draft_kept_pct, 2)})
        rows.append(row)
    return rows
