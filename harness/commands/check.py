"""`bmoe-bench check DIR...`: every problem that makes a campaign folder's result unfit to cite, one line
each (harness.report.checker); exit status 1 when any folder has one."""

from __future__ import annotations

from pathlib import Path

import typer

from harness.errors import UserError


class CheckFailed(UserError):
    exit_code = 1


def register(app: typer.Typer) -> None:
    app.command("check")(check)


def check(folders: list[Path] = typer.Argument(..., help="campaign folders under bench-data/")) -> None:
    """Check campaign folders: every planned cell and run present, every run valid (kept tokens and time
    above the minimums, summary line, rows == recorded tokens), failed runs accounted for, provenance
    complete, the lossless-output audit clean, raw files intact."""
    from harness.report.checker import check_folder

    bad = 0
    for f in folders:
        try:
            res = check_folder(f)
        except UserError as e:
            typer.echo(f"{f}: {e}", err=True)
            bad += 1
            continue
        for p in res.problems:
            typer.echo(f"{f}: {p}", err=True)
        for n in res.notes:
            typer.echo(f"{f}: note: {n}")
        if res.ok:
            typer.echo(f"{f}: ok")
        else:
            bad += 1
    if bad:
        raise CheckFailed(f"{bad} of {len(folders)} folder(s) failed the check (problems listed above)")
