"""findings.md as a string (pure): verdict first, setup, results, run order and entry state, the I/O
roofline, what this does not show, how to reproduce, and the author's own section, carried over verbatim
from the previous findings.md. Nothing in it depends on the time it is generated."""

from __future__ import annotations

import math

from harness.report import replication
from harness.report.audit import audit, audit_section
from harness.report.collect import CampaignData
from harness.report.config_md import config_table
from harness.report.fleet import fleet_of, fleet_section, fleet_verdict, fleet_warnings, pooled_note
from harness.report.intervals import fmt, methods_note, pairing_lines, precision_lines
from harness.report.peers import engines_section
from harness.report.prepared_md import preparation_lines
from harness.report.provenance_md import provenance_lines, provenance_warnings
from harness.report.recall_md import recall_section
from harness.report.results import Results
from harness.report.roof import combined_roofline, io_roofline
from harness.report.sample import sample_section
from harness.report.steady_md import cooldown_terms, deferred_lines, mark_table, throttle_warnings
from harness.report.traced import traced_section

AUTHOR_BEGIN = "<!-- author-notes: begin (kept verbatim when the report is regenerated) -->"
AUTHOR_END = "<!-- author-notes: end -->"
AUTHOR_PLACEHOLDER = "_(Your interpretation goes here; `bmoe-bench report` keeps this section.)_"


def author_section(previous: str | None) -> str:
    if previous and AUTHOR_BEGIN in previous and AUTHOR_END in previous:
        return previous.split(AUTHOR_BEGIN, 1)[1].split(AUTHOR_END, 1)[0].strip("\n")
    return AUTHOR_PLACEHOLDER


def _f(x: float | None, nd: int = 2, unit: str = "") -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x:.{nd}f}{unit}"


def _iv(iv, nd: int = 2, suffix: str = "") -> str:
    return fmt(iv, nd, suffix)


def verdict(res: Results) -> list[str]:
    ranked = sorted([c for c in res.cells if c.tok_s is not None], key=lambda c: -c.tok_s.point)
    if not ranked:
        return ["**No result**: no run finished successfully; see the failed runs below."]
    win = ranked[0]
    lines = []
    if len(ranked) >= 2 and win.tok_s.overlaps(ranked[1].tok_s):
        ties = [c.label for c in ranked[1:] if c.tok_s.overlaps(win.tok_s)]
        lines.append(f"**No difference detectable** between **{win.label}** ({_iv(win.tok_s)} tok/s) and "
                     f"{', '.join(f'**{t}**' for t in ties)}: their 95% confidence intervals overlap.")
    else:
        lines.append(f"**{win.label}** is fastest: {_iv(win.tok_s)} tok/s"
                     + (" (95% CI)." if win.tok_s.between_runs else "."))
    if win is not res.base and win.ratio is not None:
        r = win.ratio
        lines.append(f"Against the base cell ({res.base.label}, {_iv(res.base.tok_s)} tok/s) that is "
                     f"{_iv(r, 2, 'x')}"
                     + (": the ratio's CI includes 1, so no difference from the base is detectable."
                        if r.contains(1.0) else "."))
    elif win is res.base:
        lines.append("No cell beats the base cell.")
    slow = ranked[-1]
    if slow is not win and slow.ratio is not None and len(ranked) > 2:
        lines.append(f"Slowest: **{slow.label}**, {_iv(slow.ratio, 2, 'x')} the base.")
    if any(not c.tok_s.between_runs for c in ranked):
        lines.append("Cells with one run have no interval between runs (their spread within the run is no "
                     "substitute): no difference involving them is established.")
    return lines


def _replayed_trace(data: CampaignData) -> str | None:
    """The route trace every cell replays (engine flag --route-replay), or None."""
    traces = {str(c.flags.get("--route-replay") or "") for c in data.cells}
    return traces.pop() if len(traces) == 1 and "" not in traces else None


def _setup(data: CampaignData, res: Results) -> list[str]:
    m, p = data.manifest, data.plan
    tgt = m.target
    model = m.model
    out = ["## Setup", ""]
    if p.description:
        out += [p.description.strip(), ""]
    replay = _replayed_trace(data)
    if model.recipe and replay:
        size = f", {model.bytes / 2**20:.0f} MiB" if model.bytes else ""
        out.append(f"- **Model**: synthetic, `make-model` recipe `{model.recipe}`{size}; routing replayed "
                   f"from the recorded trace `{replay}` (`--route-replay`): a real model's expert access "
                   f"pattern; the output text is meaningless.")
    elif model.recipe:
        size = f", {model.bytes / 2**20:.0f} MiB" if model.bytes else ""
        out.append(f"- **Model**: synthetic, `make-model` recipe `{model.recipe}`{size} (random router "
                   f"weights: routing is near-uniform and the output text is meaningless).")
    else:
        size = f" ({model.bytes / 2**20:.0f} MiB)" if model.bytes else ""
        out.append(f"- **Model**: `{model.path if 'path' in model.model_fields_set else p.model.path}`{size}.")
    if tgt.kind == "local":
        cap = f"; memory cap **{tgt.mem_cap_mib} MiB** (cgroup, page cache charged)" \
            if tgt.mem_cap_mib else "; no memory cap"
        mem_gib = (tgt.mem_total_mib if tgt.mem_total_mib is not None else math.nan) / 1024
        out.append(f"- **Target**: this machine, {tgt.cpu_model}, {tgt.cpus} CPUs, "
                   f"{_f(mem_gib, 1)} GiB RAM, Linux {tgt.kernel}{cap}; "
                   f"page cache {'dropped' if tgt.drop_caches else 'not dropped'} before runs"
                   + ("; the model file evicted from the page cache before each run (cold start, its reads "
                      "charged to the cap)." if p.target.evict_model else "."))
    else:
        desc = ", ".join(f"{k}={v}" for k, v in tgt.dump().items() if not isinstance(v, dict | list) and v is not None)
        out.append(f"- **Target**: {desc}.")
    eng = m.engine
    h = m.harness
    preamble_ver = res.fixed_config.get("engine_version") or res.fixed_config.get("version")
    engines = "; ".join(f"{k}: {e.kind} `{e.version}` (`{' '.join(e.argv0)}`)" for k, e in m.engines.items()) \
        if m.engines else f"{eng.kind} `{preamble_ver or eng.version}`"
    out.append(f"- **Engine{'s' if m.engines else ''}**: {engines}; harness "
               f"{h.bmoe_bench} at commit `{(h.commit or '?')[:12]}`"
               f"{' (uncommitted changes)' if h.dirty else ''}.")
    for k, e in (p.engines or {}).items():
        own = " ".join(f"`{f}={v}`" for f, v in e.flags.items())
        spell = " ".join(f"`{f}` as `{t}`" if t else f"`{f}` omitted" for f, t in e.spell.items())
        if own or spell:
            out.append(f"  - {k}: " + "; ".join(x for x in (f"its own flags {own}" if own else "",
                                                           f"spelling {spell}" if spell else "") if x))
    out += provenance_lines(m) + preparation_lines(data.folder)
    flags = " ".join(f"`{k}={v}`" for k, v in p.base_flags.items()) or "engine defaults"
    per = (f"at most {p.tokens} tokens per question" if p.quality else f"{p.tokens} tokens per run")
    out.append(f"- **Fixed**: base flags {flags}; {per}, the first "
               f"{p.warmup_tokens} trimmed; {_repeats(res, p.repeats)}{replication.tries_note(p)}; order {p.order} "
               f"(seed {p.seed}); one fresh engine process per run (cold expert cache"
               + (" at its first question, warm after)." if p.quality else ")."))
    cd = p.cooldown
    out.append(f"- **Cooldown gate** before each run: CPU <= {cd.cpu_temp_max_c or 'unchecked'} C, "
               f"MemAvailable >= {cd.mem_available_min_mib or 'unchecked'} MiB, waiting at most "
               f"{cd.max_wait_s} s{cooldown_terms(cd)}.")
    out.append("- **Varied** (one thing per cell): " + "; ".join(
        f"{c.label}" for c in res.cells if c.varied) + ".")
    for c in res.cells:
        facts = ", ".join(f"{k}={c.config[k]}" for k in res.varying_facts if k in c.config)
        if facts:
            out.append(f"- Engine facts of **{c.label}** (CSV preamble): {facts}.")
    if p.quality is None:
        out.append(f"- Prompt: \"{p.prompt}\"")
    else:
        out.append(f"- Prompts: {len(p.quality.ids)} GSM8K questions answered in one engine process per run "
                   f"(the quality section below); tok/s is over every question's tokens.")
    return out + [""] + config_table(res.fixed_config)


def _repeats(res: Results, repeats: int) -> str:
    q = res.precision
    if q is None:
        return f"{repeats} repeats"
    return (f"{q.rounds} rounds (repeats driven by precision: {q.min_rounds} to {q.max_rounds}, until every ratio "
            f"is within +-{100 * q.half_width:g}%)")


def _shares(c) -> str:
    """cache mgmt, mgmt CPU and exposed mgmt (not hidden behind reads) as percentages of s/token, 'w / c / e'."""
    if not (math.isfinite(c.wall_s) and c.wall_s > 0 and math.isfinite(c.mgmt_cpu_s)):
        return "n/a"
    shares = [c.mgmt_s, c.mgmt_cpu_s] + ([c.mgmt_s - c.mgmt_hidden_s] if math.isfinite(c.mgmt_hidden_s) else [])
    return " / ".join(f"{100 * v / c.wall_s:.1f}" for v in shares)


def _table(res: Results) -> list[str]:
    vk = res.varying_keys
    x_base = f"x {res.ratio_base} [95% CI]"  # a compare fleet: the base on the cell's own device
    head = ["cell", *vk, "runs", "tok/s [95% CI]", x_base, "s/token", "I/O wait", "cache mgmt",
            "mgmt CPU", "evictor CPU", "mgmt % (wall / CPU / exposed)", "compute", "MiB read/tok", "hit %",
            "peak RSS MiB", "cap peak MiB", "majflt/tok", "route agree", "prefetch MiB/tok", "prefetch wasted %",
            "guesses kept/batch", "guesses kept %"]
    cap_used = any(math.isfinite(c.cap_peak_mib) for c in res.cells)
    rss_used = any(math.isfinite(c.peak_rss_mib) for c in res.cells)
    drop = set()
    if not cap_used:
        drop.add("cap peak MiB")
    if not rss_used:
        drop.add("peak RSS MiB")
    if not any(math.isfinite(c.mgmt_cpu_s) for c in res.cells):
        drop |= {"mgmt CPU", "mgmt % (wall / CPU / exposed)"}
    if not any(math.isfinite(c.evictor_cpu_s) for c in res.cells):
        drop.add("evictor CPU")
    if not any(math.isfinite(c.route_agree) for c in res.cells):
        drop.add("route agree")
    if not any(math.isfinite(c.prefetch_mib_per_tok) for c in res.cells):
        drop |= {"prefetch MiB/tok", "prefetch wasted %"}
    if not any(math.isfinite(c.draft_per_batch) for c in res.cells):
        drop |= {"guesses kept/batch", "guesses kept %"}
    cols = [h for h in head if h not in drop]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for c in res.cells:
        runs = f"{c.n_ok}/{c.n_runs}"
        vals = {
            "cell": f"**{c.label}**" if c.varied == {} else c.label,
            "runs": runs, "tok/s [95% CI]": _iv(c.tok_s),
            x_base: "1 (base)" if res.is_base(c) else _iv(c.ratio, 2),
            "s/token": _f(c.wall_s, 3), "I/O wait": _f(c.io_s, 3), "cache mgmt": _f(c.mgmt_s, 3),
            "mgmt CPU": _f(c.mgmt_cpu_s, 3), "evictor CPU": _f(c.evictor_cpu_s, 3),
            "mgmt % (wall / CPU / exposed)": _shares(c),
            "compute": _f(c.compute_s, 3), "MiB read/tok": _f(c.mib_per_tok, 1), "hit %": _f(c.hit_pct, 1),
            "peak RSS MiB": _f(c.peak_rss_mib, 0), "cap peak MiB": _f(c.cap_peak_mib, 0),
            "majflt/tok": _f(c.majflt_per_tok, 1), "route agree": _f(c.route_agree, 3),
            "prefetch MiB/tok": _f(c.prefetch_mib_per_tok, 1), "prefetch wasted %": _f(c.prefetch_wasted_pct, 1),
            "guesses kept/batch": _f(c.draft_per_batch, 2), "guesses kept %": _f(c.draft_kept_pct, 1),
        }
        for k in vk:
            vals[k] = c.config.get(k, "n/a")
        lines.append("| " + " | ".join(str(vals[h]) for h in cols) + " |")
    notes = [
        "",
        f"tok/s per run = tokens kept / their summed wall time. {methods_note(res)}",
        "s/token split: *I/O wait* is the time a token waited for expert reads (`stall_ms`); *cache mgmt* "
        "is `mgmt_ms`; *compute* is the engine's residual (wall - stall - mgmt), so page faults of an mmap "
        "baseline land in compute (see majflt/tok). n/a = the engine did not measure it.",
        *(["*mgmt CPU* is the compute thread's own CPU time inside *cache mgmt* (`mgmt_cpu_ms`, thread CPU "
           "clock): the rest of that wall time it was off the CPU (waiting for a core while the read lanes' "
           "kernel work or another thread ran, or blocked on a lock or the GIL); *mgmt %* is cache mgmt, mgmt CPU "
           "and *exposed* mgmt as shares of s/token: exposed is cache mgmt less the part spent while demand reads "
           "were in flight that the token then waited for (`mgmt_hidden_ms`: a wait over 50 us right after), "
           "i.e. the part on the token's critical path."] if "mgmt CPU" not in drop else []),
        *(["*evictor CPU* is the CPU time of the decode eviction decisions (the policy's evict step and the drops' "
           "hand-off) run on the engine's evictor thread while the layer's reads and matmuls run (`mgmt_bg_cpu_ms`; "
           "`--no-evict-thread` runs them on the compute thread, inside cache mgmt): not in cache mgmt or mgmt CPU; "
           "the compute thread's wait for it is in cache mgmt. 0 where the evictor is off (read-ahead, route-ahead, "
           "router weights, no cache)."] if "evictor CPU" not in drop else []),
    ]
    if cap_used:
        notes.append("cap peak = the memory-cap cgroup's peak, page cache included.")
    if "route agree" not in drop:
        notes.append("route agree (--route-ahead, LOSSY): the mean per token of the share of routed-ahead slots whose "
                     "committed expert is among that layer's own router's top-k; on a synthetic model's random "
                     "routing it says nothing about a real model's.")
    if "prefetch MiB/tok" not in drop:
        notes.append("prefetch MiB/tok (--prefetch, --predict-prefetch): speculative bytes read per token, part of "
                     "MiB read/tok; prefetch wasted % is the share of them evicted before any lookup used them "
                     "(settled later than read, so the last tokens' reads may still be unsettled).")
    if "guesses kept/batch" not in drop:
        notes.append("guesses kept/batch (--ngram, --mtp): guessed tokens kept per verify batch that carried guesses "
                     "(each kept guess is a token written without a decode of its own); guesses kept % is the share "
                     "of the guesses made that were kept. Both over the kept tokens.")
    return lines + notes


def _run_order(data: CampaignData) -> list[str]:
    cells = {c.index: c.label for c in data.cells}
    lines = ["| # | run | cell | round | start (UTC) | s | status | gate wait s | CPU C at entry | "
             "MemAvailable MiB | freq ceiling |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    from harness.report.results import freq_fraction

    # in the order they actually ran (a resumed or retried campaign differs from the plan); pending last
    for i, r in enumerate(sorted(data.runs, key=lambda r: (r.rec.start or "~", r.rec.position))):
        rec = r.rec
        e = rec.entry_state
        g = rec.gate
        st = rec.status
        if st == "failed":
            st = f"failed: {rec.reason}"
        if rec.previous_attempts:
            st += f" (attempt {len(rec.previous_attempts) + 1})"
        if rec.deferrals:
            st += f" (deferred {len(rec.deferrals)}x: the device stayed hot)"
        wait = _f(g.waited_s, 0) + (" (gave up)" if g.gave_up else "") if g is not None else "n/a"
        fr = freq_fraction(e)
        start = (rec.start or "")[:19].replace("T", " ")
        lines.append(f"| {i + 1} | {rec.run_id} | {cells[rec.cell]} | {rec.round + 1} | "
                     f"{start or 'n/a'} | {_f(rec.wall_s, 1)} | {st} | {wait} | "
                     f"{_f(e.cpu_temp_c if e else None, 1)} | {_f(e.mem_available_mib if e else None, 0)} | "
                     f"{'n/a' if fr is None else f'{fr:.0%}'} |")
    return lines


def _roofline(data: CampaignData, res: Results) -> list[str]:
    bw = data.manifest.read_bandwidth
    mib_s = bw.mib_s if bw is not None else None
    out = ["## I/O roofline", ""]
    if not mib_s:
        out.append(f"Read bandwidth not measured ({bw.method if bw is not None else 'no probe on this target'}), so no "
                   f"roofline: measure the storage (a local target probes the model file before the first run).")
        return out
    out.append(f"Measured read bandwidth of the model's storage: **{mib_s:.0f} MiB/s** ({bw.method}). "
               f"A cell that reads M MiB per token cannot exceed {mib_s:.0f} / M tok/s from I/O alone. The "
               f"combined roofline of a streamed cell is 1 / max(M / {mib_s:.0f}, C), C its own compute s/token "
               f"(the engine's residual: wall - I/O wait - cache mgmt, so it includes the hook; a resident "
               f"run's compute is not measured here): reads wholly hidden behind compute reach it.")
    out += ["", "| cell | MiB read/tok | I/O roofline tok/s | compute s/tok | combined roofline tok/s | "
                "achieved tok/s | % of I/O roofline | % of combined |",
            "|---|---|---|---|---|---|---|---|"]
    for c in res.cells:
        got = c.tok_s.point if c.tok_s else None
        roof = io_roofline(c, mib_s)
        if got is None or roof is None:
            out.append(f"| {c.label} | {_f(c.mib_per_tok, 1)} | n/a | {_f(c.compute_s, 3)} | n/a | {_f(got)} "
                       f"| n/a | n/a |")
            continue
        comb = combined_roofline(c, mib_s)  # only where the engine split the token
        out.append(f"| {c.label} | {c.mib_per_tok:.1f} | {roof:.2f} | {_f(c.compute_s, 3)} | {_f(comb)} | "
                   f"{got:.2f} | {100 * got / roof:.0f}% | {'n/a' if comb is None else f'{100 * got / comb:.0f}%'} |")
    return out


def _not_shown(data: CampaignData, res: Results) -> list[str]:
    p, m = data.plan, data.manifest
    out = ["## What this does not show", ""]
    if p.quality is None:
        out.append(f"- One machine ({m.target.kind} target), one prompt, {p.tokens} tokens per "
                   f"run: longer generations, other prompts and other devices may rank the cells differently.")
        out.append("- Every run starts a fresh engine with a cold expert cache: steady-state behaviour of a "
                   "long session is not measured.")
    else:
        out.append(f"- One machine ({m.target.kind} target); tok/s mixes every question's prefill-free decode "
                   f"tokens, so cells whose replies differ in length decode different token counts.")
    tgt = m.target
    if tgt.kind == "local" and tgt.mem_cap_mib:
        out.append(f"- The {tgt.mem_cap_mib} MiB cgroup cap reproduces a device that holds less than the "
                   f"model, not that device's flash or cores: the absolute tok/s belong to this machine.")
    if not (m.read_bandwidth and m.read_bandwidth.mib_s):
        out.append("- No read-bandwidth probe, so how close each cell gets to its I/O limit is not shown.")
    if m.model.recipe and _replayed_trace(data):
        out.append("- Routing is replayed from one recorded trace of one prompt: the expert access pattern is "
                   "a real model's, but the compute runs on synthetic weights, and other prompts route "
                   "differently.")
    elif m.model.recipe:
        out.append("- The model is synthetic with random router weights: routing is near-uniform, unlike a "
                   "real model's skewed routing, so cache hit rates here say little about real models "
                   "(use route replay for that).")
    if any(c.tok_s is not None and not c.tok_s.between_runs for c in res.cells):
        out.append("- Cells with a single run: the spread between runs is unknown; the spread shown within the "
                   "run ignores run-to-run variance and the correlation between neighbouring tokens.")
    if p.repeats < 5 and res.precision is None and p.replicate is None:
        out.append(f"- {p.repeats} repeats per cell: honest 95% intervals over so few runs are wide (t with "
                   f"{p.repeats - 1} degree{'s' if p.repeats > 2 else ''} of freedom); more repeats narrow them.")
    if p.quality is None:
        out.append("- Output quality is not checked here (streamed output is byte-identical to resident by "
                   "design; lowering active experts is lossy and needs a quality run).")
    return out


def render_findings(data: CampaignData, res: Results, previous: str | None,
                    quality: list[str] | None = None, fidelity: list[str] | None = None) -> str:
    """`quality`: a quality campaign's section (harness.report.quality), placed after the run order; `fidelity`:
    a fidelity campaign's (harness.report.fidelity), after the results."""
    p, m = data.plan, data.manifest
    aud = audit(data)
    head = aud.headline()  # a lossless cell whose tokens differ from its base's: the first line
    L: list[str] = [head, ""] if head else []
    L += [f"# {p.name}: " + "; ".join(c.label for c in res.cells if c.varied) + f" vs {res.base.label}", ""]
    fl = fleet_of(data, res)  # runs on several devices: None on one target
    L += ["## Verdict", ""] + (fleet_verdict(data, res, fl) or verdict(res)) + [""]
    rp = replication.replication_of(data)  # a campaign with replicate: its tries (None otherwise)
    L += replication.verdict_lines(rp)
    n_fail = sum(len(c.failures) for c in res.cells)
    pending = sum(1 for r in data.runs if not r.rec.finished)
    if pending:
        L += [f"**Incomplete campaign**: {pending} of {len(data.runs)} runs have not run yet; rerun the "
              f"campaign command to finish it.", ""]
    hot = deferred_lines(data)
    if hot:
        L += ["**Deferred, not run hot**", ""] + [f"- {x}" for x in hot] + [""]
    if m.shard:
        L += [f"**Shard {m.shard}** of the plan: this folder holds its rounds only; `bmoe-bench merge` joins it with "
              f"the other shards' folders into the whole campaign.", ""]
    warn = [f"- {f.kind}: {f.message}" for f in res.findings] + [f"- {w}" for w in provenance_warnings(m)]
    warn += [f"- {w}" for w in fleet_warnings(fl)] + [f"- {w}" for w in throttle_warnings(data)]
    if warn:
        L += ["**Warnings**", ""] + warn + [""]
    L += _setup(data, res)
    L += ["## Results", ""] + pooled_note(fl) + mark_table(_table(res), data) + [""]  # †: throttled
    L += pairing_lines(res) + precision_lines(res)
    L += ["![tok/s per cell](plots/tok_s.png)", "", "![s/token split](plots/split.png)", "",
          "![per-token time](plots/tokens.png)", ""]
    L += sample_section(data)
    L += recall_section(data)
    L += fleet_section(data, res, fl)
    L += replication.section(data, rp)
    L += fidelity or []
    L += engines_section(data)
    L += audit_section(aud)
    L += traced_section(data)
    L += ["## Run order and entry state", "",
          f"{len(data.runs)} runs, {n_fail} failed. Entry state is the device sample that passed the cooldown "
          f"gate just before the run; samples about once a second during each run are in runs/<id>/state.jsonl.",
          ""] + _run_order(data) + [""]
    if quality:
        L += quality + [""]
    L += _roofline(data, res) + [""]
    L += _not_shown(data, res) + [""]
    # DIR, not this folder's path or name: a copied or renamed folder must still pass `report --check`
    L += ["## Reproduce", "", "```", m.reproduce,
          "bmoe-bench report DIR    # DIR: this folder", "```", "",
          "Raw data: `manifest.json` (plan, engine, target, every run's record), `runs/<id>/metrics.csv` "
          "(per-token CSV), `state.jsonl`, `engine.log`; `results.csv` is the table above.", ""]
    L += ["## Author's notes", "", AUTHOR_BEGIN, author_section(previous), AUTHOR_END, ""]
    return "\n".join(L)
