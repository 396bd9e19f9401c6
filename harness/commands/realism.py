"""`bmoe-bench realism`: how real a model's routing looks, trace by trace (harness/replay/realism.py)."""

from __future__ import annotations

from pathlib import Path

import typer

from harness.errors import UserError
from harness.formats.files import atomic_write_text
from harness.formats.route_trace import read_route_trace
from harness.replay import realism, realism_md


def realism_cmd(
    traces: list[Path] = typer.Argument(..., help="route_trace files (v1 or v2), e.g. "
                                        "data/route-traces/qwen.route.csv"),
    out: Path | None = typer.Option(None, "--out", help="Write realism.csv and realism.md into this folder "
                                    "(an existing one; nothing else in it is touched)."),
) -> None:
    """Per trace and phase: popularity skew, reuse distance, the previous token's share, LRU hits at 1/2/4 token
    cycles, each beside what uniform routing gives."""
    names = [p.name.removesuffix(".csv").removesuffix(".route") for p in traces]
    if len(set(names)) != len(names):
        raise UserError("bmoe-bench realism: two traces share a name; rename one")
    stats = [realism.all_stats(read_route_trace(p)) for p in traces]
    table = realism_md.rows(stats)
    md = realism_md.markdown(table)
    if out is None:
        typer.echo(md, nl=False)
        return
    if not out.is_dir():
        raise UserError(f"bmoe-bench realism: --out {out} is not a folder; create it first")
    atomic_write_text(out / "realism.csv", realism_md.to_csv(table))
    atomic_write_text(out / "realism.md", md)
    typer.echo(f"wrote {out / 'realism.csv'} and {out / 'realism.md'}")


def register(app: typer.Typer) -> None:
    app.command("realism")(realism_cmd)
