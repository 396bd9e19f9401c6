"""`bmoe-bench merge A B C --out D`: the folders of one plan's shards (`bmoe-bench run FILE --shard K/N` on
several machines) joined into one campaign folder, then its report (harness.campaigns.merge)."""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

from harness.errors import UserError
from harness.formats.folder import FINDINGS


def register(app: typer.Typer) -> None:
    app.command("merge")(merge)


def merge(
    folders: list[Path] = typer.Argument(..., help="the shards' campaign folders (one per shard)"),
    out: Path = typer.Option(..., "--out", help="the merged campaign folder: new, or an empty folder"),
    no_report: bool = typer.Option(False, "--no-report", help="do not write findings.md"),
) -> None:
    """Join shard folders of one plan into one campaign folder: every raw file checked against its sha256,
    folders of another plan refused; nothing is written outside --out."""
    from harness.campaigns.merge import MergeError, merge_folders
    from harness.report.build import write_report

    try:
        res = merge_folders(folders, out)
    except MergeError as e:
        if len(e.lines) == 1:
            raise UserError(e.lines[0]) from None
        for line in e.lines:
            typer.echo(line, err=True)
        raise UserError(f"merge: {len(e.lines)} problems (listed above); nothing was written") from None
    shards = ", ".join(res.shards)
    typer.echo(f"merged {len(res.shards)} folder(s) (shards {shards}): {res.n_finished} finished runs -> {res.folder}"
               + (f"; runs on {len(res.devices)} machines: {', '.join(res.devices)}" if res.devices else ""))
    if res.pending:
        typer.echo(f"{len(res.pending)} planned run(s) are in no folder given ({' '.join(res.pending[:8])}"
                   f"{' ...' if len(res.pending) > 8 else ''}): pending; `bmoe-bench run FILE --out "
                   f"{shlex.quote(str(res.folder.parent))}` runs them into this folder when it is named "
                   f"<date>-<campaign>, or merge the missing shards' folders too")
    if not no_report and res.n_finished:
        write_report(res.folder)
        typer.echo(f"report: {res.folder / FINDINGS}")
