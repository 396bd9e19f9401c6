"""`bmoe-bench` as a process: exit statuses and one-line errors."""

from __future__ import annotations

import subprocess
import sys

BENCH = [sys.executable, "-m", "harness.bench_cli"]


def run(*a: str) -> subprocess.CompletedProcess:
    return subprocess.run(BENCH + list(a), capture_output=True, text=True, timeout=120)


def test_version_exits_zero():
    p = run("--version")
    assert p.returncode == 0 and p.stdout.startswith("bmoe-bench ")


def test_unknown_command_is_one_line_and_non_zero():
    p = run("bogus")
    assert p.returncode != 0
    assert len([ln for ln in p.stderr.splitlines() if ln.strip()]) == 1 and "bogus" in p.stderr


def test_missing_campaign_file_is_one_line_and_non_zero(tmp_path):
    p = run("validate", str(tmp_path / "none.yaml"))
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert "none.yaml" in p.stderr


def test_readme_command_table_is_the_app():
    from pathlib import Path

    from harness.bench_doc import readme_block, readme_section

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    a, b = readme_block(text)
    assert text[a:b] == readme_section(), (
        "README.md's bmoe-bench command table differs from the app: run "
        "`python -m harness.bench_doc --update-readme README.md`")


def test_command_table_rows_come_from_the_commands():
    import typer

    from harness.bench_doc import readme_table

    app = typer.Typer()

    @app.command("first")
    def first(folder: str = typer.Argument(None), out: str = typer.Option(..., "--out", "-o"),
              check: bool = typer.Option(False, "--check")) -> None:
        """Does a | thing
        over <two> lines."""

    @app.command("second")
    def second(traces: list[str] = typer.Argument(...)) -> None:
        """Second."""

    assert readme_table(app).splitlines()[2:] == [
        "| `first [FOLDER]` | Does a \\| thing over &lt;two&gt; lines. | `--out` (required) `--check` |",
        "| `second TRACES...` | Second. |  |",
    ]
