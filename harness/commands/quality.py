"""`bmoe-bench grade DIR`: regrade a quality campaign folder from its committed replies (GSM8K) or records (held-out
text: a fidelity campaign's per-position log-probabilities)."""

from __future__ import annotations

from pathlib import Path

import typer

from harness.errors import UserError


def register(app: typer.Typer) -> None:
    app.command("grade")(grade)


def grade(folder: Path = typer.Argument(..., help="quality campaign folder under bench-data/")) -> None:
    """Grade every committed reply (runs/<id>/replies.jsonl) with the rule the manifest names, write
    grades.json and print each cell's accuracy with its exact 95% interval (findings.md: `report DIR`); for a
    fidelity campaign, its held-out perplexity and next-token accuracy from the per-position records."""
    from harness.formats.files import atomic_write_text
    from harness.formats.folder import GRADES_FILE
    from harness.formats.grades import grades_text
    from harness.report.collect import load_campaign_data
    from harness.report.quality import cell_quality, grade_folder

    data = load_campaign_data(folder)
    g = grade_folder(data)
    if g is None:
        from harness.report.heldout import regrade_lines

        held = regrade_lines(data)  # a fidelity campaign's per-position records: perplexity and accuracy
        if held is None:
            raise UserError(f"{folder}: this campaign has no quality block and no per-position records with "
                            "log-probabilities (bmoe_fidelity v2); nothing to grade")
        typer.echo(f"held-out text, regraded from the records (runs/<id>/fidelity.csv) of {folder}:")
        for line in held:
            typer.echo(f"  {line}")
        return
    atomic_write_text(Path(folder) / GRADES_FILE, grades_text(g))
    typer.echo(f"wrote {Path(folder) / GRADES_FILE} ({g.grader} v{g.grader_version}, {len(g.runs)} runs)")
    for x in cell_quality(data, g):
        a = x.acc
        vs = f", vs base McNemar exact p={x.vs_base.p:.3g}" if x.vs_base else " (base)"
        typer.echo(f"  {x.label}: {a.correct}/{a.n} = {100 * a.point:.1f}% [{100 * a.low:.1f}, "
                   f"{100 * a.high:.1f}]{vs}")
