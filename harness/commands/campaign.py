"""`bmoe-bench validate FILE`, `bmoe-bench run FILE`, `bmoe-bench report DIR [--check] [--migrate]`,
`bmoe-bench report --all [--check]`."""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

from harness.errors import Interrupted, RunFailed, UserError
from harness.formats.folder import FINDINGS, GRADES_FILE, MANIFEST, PLOTS_DIR, RESULTS


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)
    app.command("run")(run)
    app.command("report")(report)


SET_HELP = ("override a campaign field, checked like the file: KEY is a dotted path (model.path, "
            "target.serial, tokens, flags.--cache-mb), VALUE a YAML scalar (8, true, null); repeatable, later wins")


def _set_option() -> list[str]:
    return typer.Option([], "--set", metavar="KEY=VALUE", help=SET_HELP)


def validate(file: Path = typer.Argument(..., help="campaign YAML file"),
             set_: list[str] = _set_option()) -> None:
    """Check a campaign file (schema, one axis at a time, flags the engine would refuse) and show its
    cells and run order. A missing file that a script of scripts/ or the trained-model recipe makes is named,
    one line each with what makes it, not refused (`run` needs it)."""
    from harness.campaigns.made import plan_template
    from harness.campaigns.yamlsrc import CampaignError

    try:
        plan, made = plan_template(file, overrides=set_)
    except CampaignError as e:
        if len(e.lines) == 1:
            raise
        for line in e.lines:
            typer.echo(line, err=True)
        raise UserError(f"{file}: {len(e.lines)} problems (listed above)") from None
    c = plan.campaign
    if c.overrides:
        typer.echo(f"{file}: with " + ", ".join(f"--set {o}" for o in c.overrides))
    more = (f", then whole rounds until every ratio is within +-{100 * c.precision.ratio_half_width:g}% (at most "
            f"{c.precision.max_repeats})") if c.precision else ""
    if c.replicate is not None:
        from harness.formats.campaign_replicate import tries_text

        more += f" ({tries_text(c.replicate)})"
    typer.echo(f"{file}: ok: campaign {c.name}, {len(plan.cells)} cells x {c.min_repeats()} repeats = "
               f"{len(plan.runs)} runs of {c.tokens} tokens{more}, order {c.order}, target {c.target.kind}")
    for m in made:
        typer.echo(f"  made: {m.line(c)}")
    for cell in plan.cells:
        typer.echo(f"  c{cell.index:02d} {cell.label}")
    typer.echo("  order: " + " ".join(r.run_id for r in plan.runs))
    if c.fidelity is not None:
        from harness.campaigns.fidelity import plan_scoring

        scored = plan_scoring(c, plan.cells).cells
        typer.echo(f"  fidelity: one reference (the base cell's flags, -c {c.fidelity.ctx}), then the first round of "
                   f"{len(scored)} cell(s) scored against it: " + " ".join(f"c{i:02d}" for i in scored))


def run(
    file: Path = typer.Argument(..., help="campaign YAML file"),
    out: Path = typer.Option(Path("bench-data"), "--out", help="where campaign folders go"),
    fresh: bool = typer.Option(False, "--fresh", help="start a new folder even if an unfinished one exists"),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="run the failed runs of the newest "
                                      "folder of this campaign again (their old records are kept)"),
    no_report: bool = typer.Option(False, "--no-report", help="do not write findings.md at the end"),
    set_: list[str] = _set_option(),
    shard: str | None = typer.Option(None, "--shard", metavar="K/N", help="run only shard K of N of the plan "
                                     "(its rounds K, K+N, ...), in a folder of its own; `bmoe-bench merge` joins "
                                     "the shards' folders"),
    device_timeout: float | None = typer.Option(None, "--device-timeout", metavar="S", min=1.0, help=(
        "adb and SSH targets: the longest one exchange with the device's server may take (default 30 s; a server "
        "silent for half as long, at most 15 s, is called stalled); runs and copies have their own bounds")),
) -> None:
    """Run (or resume) a campaign: one engine process per run, raw files under OUT/<date>-<name>/,
    then the report. Exit status 1 if any run failed. --set overrides are part of the plan: the same
    command (same --set arguments) resumes the folder; other ones start a new folder."""
    from harness import interrupts
    from harness.campaigns.runner import run_campaign
    from harness.campaigns.shard import Shard
    from harness.formats.files import DiskFull
    from harness.report.build import write_report

    part = Shard.parse(shard) if shard is not None else None
    resume = resume_command(file, out, set_) + (f" --shard {part}" if part else "") \
        + (f" --device-timeout {device_timeout:g}" if device_timeout else "")
    from harness.devices.timeouts import command_limits

    restore = interrupts.install()  # SIGTERM stops a campaign as cleanly as Ctrl-C, and neither is lost
    try:
        with command_limits(device_timeout):
            res = run_campaign(file, root=out, fresh=fresh, retry_failed=retry_failed, overrides=set_,
                               shard=part)
    except KeyboardInterrupt:
        interrupts.handled()
        raise Interrupted(f"interrupted: finished runs are kept; run `{resume}` to continue") from None
    except DiskFull as e:
        raise DiskFull(f"{e.head}; free space there and run `{resume}` to continue (finished runs are "
                       f"kept)") from None
    finally:
        restore()
    if not no_report and res.n_ok > 0:
        try:
            write_report(res.folder)
        except DiskFull as e:
            raise DiskFull(f"{e.head}; every run is kept: free space there and run `bmoe-bench report "
                           f"{shlex.quote(str(res.folder))}`") from None
        typer.echo(f"report: {res.folder / FINDINGS}")
    typer.echo(f"{res.n_ok} runs ok, {res.n_failed} failed"
               f"{f', {res.n_skipped} finished earlier' if res.n_skipped else ''}: {res.folder}")
    if part is not None:
        typer.echo(f"shard {part}: join it with the other shards' folders: bmoe-bench merge "
                   f"{shlex.quote(str(res.folder))} OTHER-SHARD-FOLDERS... --out NEW-FOLDER")
    if res.n_not_run:
        raise RunFailed(f"{res.n_not_run} run(s) not run: {res.not_run or 'no device could take them'}; when the "
                        f"devices are back, run `{resume}` to run only those (finished runs are kept)")
    if res.n_deferred:
        raise RunFailed(f"{res.n_deferred} run(s) deferred, not run hot: the device did not meet the cooldown "
                        f"condition ({res.deferred}); cool it and run `{resume}` to run only those (finished runs "
                        f"are kept)")
    if res.n_failed:
        raise RunFailed(f"{res.n_failed} of {res.n_ok + res.n_failed} runs failed (reasons in "
                        f"{res.folder / MANIFEST}); fix the cause and run `{resume} --retry-failed` "
                         f"(finished runs are kept)")


def resume_command(file: Path, out: Path, set_: list[str]) -> str:
    """The whole command that continues this campaign: the file, --out, and every --set (not --fresh)."""
    return (f"bmoe-bench run {shlex.quote(str(file))} --out {shlex.quote(str(out))}"
            + "".join(f" --set {shlex.quote(o)}" for o in set_))


def report(
    folder: Path | None = typer.Argument(None, help="campaign folder under bench-data/ (with --all: the "
                                                    "bench-data folder, default bench-data)"),
    check: bool = typer.Option(False, "--check", help="exit non-zero if a run's raw files changed since it was "
                                                      "committed, findings.md or results.csv differ from "
                                                      "what the raw data gives, or `bmoe-bench check` finds a "
                                                      "problem"),
    migrate: bool = typer.Option(False, "--migrate", help="rewrite an older manifest at the current version, "
                                                          "recording the sha256 of the raw files as they are now"),
    all_: bool = typer.Option(False, "--all", help="write reports/README.md (next to bench-data/): every "
                                                   "campaign folder, one table per model; and "
                                                   "reports/<family>.md for every `family:`"),
) -> None:
    """Regenerate findings.md, results.csv and plots/ from a campaign folder's raw files; with --all,
    reports/README.md from every folder under bench-data/."""
    from harness.report.build import check_message, check_report, unverified_note, write_report

    if all_:
        return report_all(folder or Path("bench-data"), check)
    if folder is None:
        raise UserError("report: name a campaign folder (bmoe-bench report bench-data/<folder>), or use --all")
    if migrate:
        from harness.formats.manifest import VERSION
        from harness.formats.manifest_migrate import migrate_folder

        old, hashed = migrate_folder(folder)
        typer.echo(f"{folder}: manifest v{old} -> v{VERSION}, raw-file hashes recorded for {len(hashed)} run(s)")
        if not check:
            return
    if check:
        from harness.report.checker import check_folder

        bad = check_report(folder)
        if bad:
            raise UserError(check_message(folder, bad))
        checked = check_folder(folder)
        if not checked.ok:
            raise UserError(f"{folder}: `bmoe-bench check` finds {len(checked.problems)} problem(s): "
                            + " | ".join(checked.problems))
        note = unverified_note(folder)
        graded = (Path(folder) / GRADES_FILE).is_file()
        typer.echo(f"{folder}: {'' if note else 'raw files unchanged since committed, '}{FINDINGS}"
                   f"{', results.csv and grades.json' if graded else ' and results.csv'} match the raw data"
                   + (f"; {note}" if note else ""))
        return
    write_report(folder)
    typer.echo(f"wrote {Path(folder) / FINDINGS}, {RESULTS}, {PLOTS_DIR}/")


def report_all(bench: Path, check: bool) -> None:
    """`report --all [--check]`: reports/README.md beside the bench-data folder."""
    from harness.report.family import check_families, write_families
    from harness.report.overview import REPORT, check_overview, write_overview

    out = bench.parent / "reports"
    if check:
        problem = check_overview(bench, out)
        if problem:
            raise UserError(f"{out / REPORT} {problem}; run `bmoe-bench report --all` and commit the result")
        bad = check_families(bench, out)
        if bad:
            raise UserError(" | ".join(bad) + "; run `bmoe-bench report --all` and commit the result")
        typer.echo(f"{out / REPORT} matches {bench}")
        return
    typer.echo(f"wrote {write_overview(bench, out)}")
    for p in write_families(bench, out):
        typer.echo(f"wrote {p} (and its .png)")
