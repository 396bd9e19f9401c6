"""Write findings.md for a replay report from the grid's results (pure: returns the text).

Only generic, data-driven text: what was replayed, the numbers, how the replay measures. A study's own
reading of them (its goal's origin, what it refutes, how far its traces generalise) belongs in the
folder's author notes, which a regeneration keeps verbatim."""

from __future__ import annotations

import math
from collections.abc import Sequence

from harness.engine import ONLINE_DEFAULT
from harness.replay.bounds import BOUNDS, NEXT_TOKEN_BONUS, TOLD_WHAT
from harness.replay.report import KEY_BUDGETS_MIB, Comparison, compare, offline
from harness.replay.simulate import MIB, ReplayResult
from harness.replay.trace import RouteTrace
from harness.replay.validate import Agreement, EngineLog
from harness.report.findings import AUTHOR_BEGIN, AUTHOR_END, author_section


def _worst_vs_lru(cs: Sequence[Comparison]) -> Comparison:
    """The budget where the policy does worst against LRU, among budgets where eviction matters
    (Belady above LRU); above the working set every policy ties."""
    live = [c for c in cs if c.belady - c.lru > 1e-6] or list(cs)
    return min(live, key=lambda c: c.policy - c.lru)


def rank_online(results: Sequence[ReplayResult], goal_trace: str) -> list[tuple[str, bool, float]]:
    """Online policies as (name, never loses to LRU on any trace/budget, mean gap closed on the goal
    trace at the key budgets), best first: the ones that never lose, then by gap closed."""
    out = []
    for pol in dict.fromkeys(r.policy for r in results):
        if pol in ("lru",) or offline(pol):
            continue
        cs = compare(results, pol)
        never = all(c.policy >= c.lru - 1e-9 for c in cs)
        key = [c.gap_closed for c in cs if c.trace == goal_trace and c.budget_mib in KEY_BUDGETS_MIB]
        key = [g for g in key if not math.isnan(g)]
        out.append((pol, never, sum(key) / len(key) if key else float("nan")))
    return sorted(out, key=lambda x: (not x[1], -x[2] if not math.isnan(x[2]) else math.inf))


def findings_md(
    traces: Sequence[RouteTrace],
    results: Sequence[ReplayResult],
    checks: dict[str, tuple[EngineLog | None, Agreement | None]],
    command: str,
    figures: dict[str, str],
    csv_name: str,
    goal_trace: str,
    previous: str | None = None,
    bounds: Sequence[ReplayResult] = (),
    bounds_csv: str = "bounds.csv",
) -> str:
    """The report; `previous` (the findings.md being replaced) gives the author-notes section, kept
    verbatim."""
    ranked = rank_online(results, goal_trace)
    best, best_never, _ = ranked[0]
    cs = compare(results, best)
    key = [c for c in cs if c.trace == goal_trace and c.budget_mib in KEY_BUDGETS_MIB]
    goal_met = bool(key) and all(c.gap_closed >= 0.5 for c in key) and best_never
    L: list[str] = []
    L.append("# Expert-cache replay on real routing traces: LRU, Belady and online policies\n")
    L.append("## Verdict\n")
    key_txt = "; ".join(
        f"{c.budget_mib:g} MiB: LRU {c.lru:.1f}% -> {best} {c.policy:.1f}% (Belady {c.belady:.1f}%, "
        f"{100 * c.gap_closed:.0f}% of the gap)" for c in key
    )
    L.append(
        f"Best online policy: **{best}**. On {goal_trace} it closes "
        f"{', '.join(f'{100 * c.gap_closed:.0f}%' for c in key)} of the LRU->Belady gap at "
        f"{', '.join(f'{c.budget_mib:g}' for c in key)} MiB ({key_txt}). "
    )
    for t in traces:
        tc = [c for c in cs if c.trace == t.name]
        w = _worst_vs_lru(tc)
        below = [c for c in tc if c.budget_mib * MIB < t.cycle_bytes]
        below_txt = (
            f" Under T ({t.cycle_bytes / MIB:.0f} MiB) LRU hits {max(c.lru for c in below):.1f}% at best, "
            f"{best} {min(c.policy for c in below):.1f}-{max(c.policy for c in below):.1f}%."
            if below else ""
        )
        above = [c for c in tc if c.budget_mib * MIB >= t.cycle_bytes]
        g = max(above, key=lambda c: c.policy - c.lru) if above else None
        gain_txt = (f" From T up its largest gain over LRU is {g.policy - g.lru:+.1f} points (at "
                    f"{g.budget_mib:g} MiB)." if g else "")
        L.append(
            f"On {t.name} over {len(tc)} budgets from {tc[0].budget_mib:g} to {tc[-1].budget_mib:g} MiB its "
            f"smallest margin over LRU where eviction matters is {w.policy - w.lru:+.2f} points (at "
            f"{w.budget_mib:g} MiB).{below_txt}{gain_txt} "
        )
    budgets = ", ".join(str(b) for b in KEY_BUDGETS_MIB)
    if goal_met:
        L.append(f"\n\nGoal **met**: >= half the gap at {budgets} MiB on {goal_trace} and never below LRU on "
                 "any trace.\n")
    else:
        L.append(f"\n\nGoal (>= half the gap at {budgets} MiB on {goal_trace}, never below LRU) **not met**"
                 + (" (it never loses to LRU, but closes less than half the gap).\n" if best_never else ".\n"))
    if bounds:
        L.append(_bounds_verdict(results, bounds, goal_trace))
    L.append(f"\nEngine default (`ONLINE_DEFAULT` in harness/engine/cache/policies/): `{ONLINE_DEFAULT}`.\n")
    L.append("\nOnline policies ranked (never below LRU on every trace and budget, then mean share of the "
             f"gap closed on {goal_trace} at the key budgets):\n")
    for pol, never, g in ranked:
        w = _worst_vs_lru(compare(results, pol))
        L.append(f"- `{pol}`: never below LRU: {'yes' if never else 'no'} (worst margin {w.policy - w.lru:+.2f} "
                 f"points, {w.trace} at {w.budget_mib:g} MiB); mean gap closed {100 * g:.0f}%")
    L.append("")

    if bounds:
        L += _bounds_section(traces, results, bounds, goal_trace, bounds_csv)
    L.append("## Validation: LRU replay against the engine's own record\n")
    L.append("| trace | engine budget | engine log hit % | trace residency hit % | LRU replay hit % | "
             "lookups agreeing |")
    L.append("|---|---|---|---|---|---|")
    for name, (log, agr) in checks.items():
        if agr is None or log is None:
            L.append(f"| {name} | ? | no .log found | | | |")
            continue
        L.append(f"| {name} | {log.budget_mib} MiB | {log.hit_pct:.1f} | {agr.recorded_hit_pct:.2f} | "
                 f"{agr.replay_hit_pct:.2f} | {agr.same}/{agr.lookups} |")
    L.append("")

    L.append("## Curves\n")
    for name, fig in figures.items():
        L.append(f"![{name}]({fig})\n")
    L.append("T (red) is one token cycle, sum over layers of k x expert bytes; grey is the trace's working "
             "set (every distinct expert it touches): above it nothing is evicted. Belady dashed.\n")

    L.append("## Table at the budgets that matter\n")
    for t in traces:
        shown = sorted({500, 1000, round(t.cycle_bytes / MIB), *KEY_BUDGETS_MIB, 6000})
        rs = {(r.policy, round(r.budget_mib)): r for r in results if r.trace == t.name}
        pols = list(dict.fromkeys(r.policy for r in results if r.trace == t.name))
        shown = [b for b in shown if any((p, b) in rs for p in pols)]
        L.append(f"**{t.name}** ({t.arch}, T = {t.cycle_bytes / MIB:.0f} MiB, working set "
                 f"{t.working_set_bytes / MIB:.0f} MiB): hit % / decode MiB per token\n")
        L.append("| policy | " + " | ".join(f"{b} MiB" for b in shown) + " |")
        L.append("|---|" + "---|" * len(shown))
        for p in pols:
            cells = [f"{rs[(p, b)].hit_pct:.1f} / {rs[(p, b)].mib_per_token:.0f}" if (p, b) in rs else ""
                     for b in shown]
            L.append(f"| {p}{' (offline)' if offline(p) else ''} | " + " | ".join(cells) + " |")
        L.append("")

    L.append("## How it was measured\n")
    L.append(
        "The replay drives the engine's own `ExpertCache` (harness/engine/cache/expert_cache.py) with the engine's "
        "own policy objects (harness/engine/cache/policies/): one lookup per unique expert per layer batch, a "
        "duplicate only promotes, a miss costs its layer's expert bytes, eviction after the batch never "
        "evicts the batch. Prefill rows are grouped into one batch per layer (every prompt token's experts "
        "in routing order), decode rows into one batch per (token, layer). Hit % is cumulative over "
        "prefill and decode lookups, as the engine prints it; MiB/token is decode expert bytes read per "
        "decode token (the engine's `moe-stream` figure less its O_DIRECT page padding). Belady is "
        f"farthest-next-use, given the whole lookup sequence (offline only); {_belady_caveat(traces)}\n"
    )
    L.append("## What this does not show\n")
    L.append(
        "- Hits and bytes, not tokens per second: no I/O queueing, no overlap with compute, no policy "
        "CPU cost (the aged policies and markov-duel compare one number per layer on each eviction; "
        "aged-markov and markov-duel also do a few numpy passes over a layer's experts per layer batch).\n"
        "- No prefetching: Belady here is a *demand* cache (the best one where sizes are equal); a predictor "
        "that reads ahead can do better than this bound on stalls, not on bytes.\n"
        "- Cold start: each replay starts empty, like one engine process per run.\n"
    )
    L.append("## Reproduce\n")
    L.append(f"```\n{command}\n```\n")
    L.append(f"Raw results: `{csv_name}` (columns trace,policy,budget_mib,hit_pct,mib_per_token).\n")
    L += ["## Author's notes\n", AUTHOR_BEGIN, author_section(previous), AUTHOR_END, ""]
    return "\n".join(L)


def _belady_caveat(traces: Sequence[RouteTrace]) -> str:
    """Where Belady is the optimum (a trace whose experts all have one size) and where it is not."""
    mixed = [t for t in traces if len(set(t.expert_bytes)) > 1]
    if not mixed:
        return "every trace's experts have one size, where farthest-next-use is the optimum."
    sizes = "; ".join(
        f"{t.name} ({' vs '.join(f'{b / 1e6:.2f}' for b in sorted(set(t.expert_bytes)))} MB)" for t in mixed
    )
    return f"sizes differ between layers on {sizes}, where farthest-next-use is the standard rule, not a proven " \
        "optimum."


def _gaps(results: Sequence[ReplayResult], bounds: Sequence[ReplayResult], policy: str,
          trace: str) -> list[Comparison]:
    cs = compare([*results, *bounds], policy)
    return [c for c in cs if c.trace == trace and c.budget_mib in KEY_BUDGETS_MIB]


def _pcts(cs: Sequence[Comparison]) -> str:
    return "/".join(f"{100 * c.gap_closed:.0f}" for c in cs) + "%"


def _bounds_verdict(results: Sequence[ReplayResult], bounds: Sequence[ReplayResult], goal_trace: str) -> str:
    """One paragraph: which informed bounds reach the goal on the goal trace, which do not."""
    names = list(dict.fromkeys(r.policy for r in bounds))
    reach, short = [], []
    for b in names:
        cs = _gaps(results, bounds, b, goal_trace)
        if len(cs) == len(KEY_BUDGETS_MIB):
            (reach if all(c.gap_closed >= 0.5 for c in cs) else short).append(f"`{b}` {_pcts(cs)}")
    budgets = "/".join(str(b) for b in KEY_BUDGETS_MIB)
    return (
        f"\nWhat it would take (informed bounds, below: markov-duel told part of the future), share of the "
        f"gap closed on {goal_trace} at {budgets} MiB: short of half at some key budget: "
        f"{', '.join(short) or 'none'}; half or more at all of them: {', '.join(reach) or 'none'}.\n"
    )


def _bounds_section(traces: Sequence[RouteTrace], results: Sequence[ReplayResult],
                    bounds: Sequence[ReplayResult], goal_trace: str, bounds_csv: str) -> list[str]:
    L = ["## How far an online policy can go: informed bounds\n"]
    L.append(
        "Each bound is the engine's `markov-duel` (same features, weights and duel) *told* one piece of the "
        "future by the trace (harness/replay/bounds.py), so the ladder shows which information closes the "
        "LRU->Belady gap. Offline, replay only, run through the same ExpertCache. Cells: hit % (share of the "
        "gap closed).\n"
    )
    cols = [f"{b} MiB" for b in KEY_BUDGETS_MIB]
    L.append("| trace | policy | told | " + " | ".join(cols) + " |")
    L.append("|---|---|---|" + "---|" * len(cols))
    rows = ["lru", "markov-duel", *dict.fromkeys(r.policy for r in bounds), "belady"]
    told = {"lru": "(online)", "markov-duel": "nothing (online)", "belady": "the whole future (offline optimum)",
            **{b: TOLD_WHAT.get(b, "") for b in BOUNDS}}
    for t in traces:
        for pol in rows:
            cs = {c.budget_mib: c for c in _gaps(results, bounds, pol, t.name)}
            if not cs:
                continue
            cells = [f"{cs[b].policy:.1f} ({100 * cs[b].gap_closed:.0f}%)" if b in cs else "" for b in KEY_BUDGETS_MIB]
            L.append(f"| {t.name} | {pol} | {told.get(pol, '')} | " + " | ".join(cells) + " |")
    L.append("")
    L.append(
        f"Raw: `{bounds_csv}` (same columns as the replay CSV). The bounds use markov-duel's hand-set weights; "
        "a different machinery told the same facts could do better. Told the next token's routing, the bonus "
        f"({NEXT_TOKEN_BONUS:+g}, log2 units) puts every entry the next token uses above every other entry of "
        "its layer.\n"
    )
    return L
