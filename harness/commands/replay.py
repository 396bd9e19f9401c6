"""`bmoe-bench replay` and `bmoe-bench replay-report`: route traces through the engine's cache policies."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer

from harness.errors import UserError
from harness.formats.folder import FINDINGS
from harness.replay.bounds import BOUNDS
from harness.replay.findings import findings_md
from harness.replay.report import (
    KEY_BUDGETS_MIB,
    fine_grid,
    parse_budgets,
    parse_policies,
    plot_curves,
    render_table,
    run_grid,
    to_csv,
)
from harness.replay.trace import load_trace
from harness.replay.validate import lru_agreement, read_engine_log


def replay_cmd(
    traces: list[Path] = typer.Argument(..., help="route_trace v1 CSV files (e.g. qwen.route.csv)."),
    budgets: str = typer.Option("500,1000,2000,3000,4000", help="Cache budgets in MiB, comma separated."),
    policies: str = typer.Option("lru,belady", help="Comma list of policies, or 'all' (every cache policy); "
                                 "told-* names are informed bounds (offline, see harness/replay/bounds.py)."),
    fmt: str = typer.Option("table", "--format", help="table (rich) or csv."),
    plot: Path | None = typer.Option(None, "--plot", help="Also draw hit %-vs-budget curves to this PNG."),
) -> None:
    """Replay routing traces through the engine's expert cache: hit %, MiB read per token, and T."""
    if fmt not in ("table", "csv"):
        raise UserError(f"--format {fmt!r}: use table or csv")
    pols = parse_policies(policies)
    bud = parse_budgets(budgets)
    loaded = [load_trace(p) for p in traces]
    _unique_names(loaded)
    results = run_grid(loaded, pols, bud)
    if fmt == "csv":
        sys.stdout.write(to_csv(results))
    else:
        from rich.console import Console

        console = Console()
        console.print(render_table(results, loaded))
        for t in loaded:
            console.print(f"{t.name}: T = {t.cycle_bytes / 1048576:.1f} MiB (token cycle), working set "
                          f"{t.working_set_bytes / 1048576:.0f} MiB, {t.prefill_tokens} prefill + "
                          f"{t.decode_tokens} decode tokens")
    if plot is not None:
        plot_curves(results, loaded, str(plot))


def replay_report_cmd(
    traces: list[Path] = typer.Argument(..., help="route_trace v1 CSV files."),
    out: Path = typer.Option(..., "--out", help="Report directory (created): findings.md, PNGs, CSV."),
    policies: str = typer.Option("all", help="Comma list of policies, or 'all'."),
    steps: int = typer.Option(40, help="Budgets in each trace's fine grid (T/4 .. 1.1 x working set)."),
    goal_trace: str | None = typer.Option(None, help="Trace the gap-closing goal is judged on (default: the first)."),
) -> None:
    """Write a committed-style replay report: every policy over a fine budget grid per trace."""
    pols = parse_policies(policies)
    for needed in ("lru", "belady"):
        if needed not in pols:
            raise UserError(f"--policies {policies!r}: a report compares against lru and belady; include them")
    if steps < 2:
        raise UserError(f"--steps {steps}: give at least 2")
    loaded = [load_trace(p) for p in traces]
    _unique_names(loaded)
    goal_trace = goal_trace or loaded[0].name
    if goal_trace not in {t.name for t in loaded}:
        raise UserError(f"--goal-trace {goal_trace!r}: not among the traces ({', '.join(t.name for t in loaded)})")
    out.mkdir(parents=True, exist_ok=True)
    grid = {t.name: fine_grid(t, steps) for t in loaded}
    results = run_grid(loaded, pols, grid)
    csv_name = "replay.csv"
    (out / csv_name).write_text(to_csv(results))
    bound_results = run_grid(loaded, list(BOUNDS), KEY_BUDGETS_MIB)
    (out / "bounds.csv").write_text(to_csv(bound_results))
    figures = {}
    for t in loaded:
        fig = f"curves-{t.name}.png"
        plot_curves([r for r in results if r.trace == t.name], [t], str(out / fig))
        figures[t.name] = fig
    checks = {}
    for path, t in zip(traces, loaded, strict=True):
        log = read_engine_log(path)
        checks[t.name] = (log, lru_agreement(t, log.budget_mib) if log else None)
    command = "bmoe-bench replay-report " + " ".join(shlex.quote(str(p)) for p in traces) + \
        f" --out {shlex.quote(str(out))} --policies {policies} --steps {steps} --goal-trace {goal_trace}"
    md = out / FINDINGS
    previous = md.read_text() if md.exists() else None
    md.write_text(findings_md(loaded, results, checks, command, figures, csv_name, goal_trace, previous,
                              bounds=bound_results))
    typer.echo(f"wrote {out}/findings.md, {csv_name}, bounds.csv, {', '.join(figures.values())} "
               f"({len(results) + len(bound_results)} replays)")


def replay_cost_cmd(
    against: Path = typer.Option(..., "--against", help="Another checkout of the package (e.g. a `git archive` of "
                                 "an older commit) measured side by side with this one."),
    out: Path = typer.Option(..., "--out", help="Folder (created): raw.csv (every measurement) and summary.csv."),
    workloads: str = typer.Option("qwen,synth-top8", help="Comma list: qwen, gptoss (recorded traces), synth-top8."),
    policies: str = typer.Option("all", help="Comma list of online policies, or 'all'."),
    budget_mib: int = typer.Option(2000, help="Cache budget in MiB."),
    rounds: int = typer.Option(5, help="Rounds; the two checkouts alternate inside each, the order flipping."),
    pure: bool = typer.Option(False, "--pure", help="Also measure this checkout with BMOE_PURE_PYTHON_POLICIES=1 "
                              "(its pure-Python policies, not the compiled helper), as impl `pure`."),
) -> None:
    """CPU time of the expert cache's bookkeeping per decode token, driven as the engine's hook drives it
    (no llama.cpp), for this checkout and another side by side, with a digest of every decision."""
    from harness.engine import online_policies
    from harness.replay import bookkeeping as bk

    pols = online_policies() if policies == "all" else policies.split(",")
    unknown = [p for p in pols if p not in online_policies()]
    if unknown:
        raise UserError(f"--policies: unknown {', '.join(unknown)}; known: {', '.join(online_policies())}")
    eng = against / "harness" / "engine"
    if not ((eng / "cache" / "expert_cache.py").is_file() or (eng / "cache.py").is_file()):
        raise UserError(f"--against {against}: no harness/engine/cache/expert_cache.py (or, before the engine's "
                        "subpackages, cache.py) there; give a checkout of the package")
    here = Path(bk.__file__).resolve().parents[2]
    trees = {"against": against.resolve(), **({"pure": here} if pure else {}), "this": here}
    rows = bk.side_by_side(trees, workloads.split(","), pols, budget_mib, rounds,
                           {"pure": {"BMOE_PURE_PYTHON_POLICIES": "1"}, "this": {"BMOE_PURE_PYTHON_POLICIES": "0"}})
    out.mkdir(parents=True, exist_ok=True)
    (out / "raw.csv").write_text(bk.to_csv(rows, ["impl", "round", "workload", "policy", "budget_mib",
                                                  "ns_per_token", "digest"]))
    summ = bk.summary(rows)
    (out / "summary.csv").write_text(bk.to_csv(summ, list(summ[0])))
    for r in summ:
        mid = f"pure {r['pure_ms_per_token']:7.3f}  " if pure else ""
        typer.echo(f"{r['workload']:11s} {r['policy']:12s} against {r['against_ms_per_token']:7.3f} ms/token  "
                   f"{mid}this {r['this_ms_per_token']:7.3f}  x{r['ratio']:.2f}  same decisions: {r['same_decisions']}")


def _unique_names(traces) -> None:
    names = [t.name for t in traces]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise UserError(f"traces {', '.join(sorted(dup))} given twice (same file name): give each trace once")


def register(app: typer.Typer) -> None:
    app.command("replay")(replay_cmd)
    app.command("replay-report")(replay_report_cmd)
    app.command("replay-cost")(replay_cost_cmd)
