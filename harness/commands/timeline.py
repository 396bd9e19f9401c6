"""`bmoe-bench timeline`: one token's reads per lane against layer compute, from a run's io_trace and
compute_trace (a campaign run folder, or the two files of an engine run)."""

from __future__ import annotations

from pathlib import Path

import typer

from harness.errors import UserError
from harness.formats.files import atomic_write_bytes
from harness.formats.folder import COMPUTE_TRACE_FILE, IO_TRACE_FILE
from harness.formats.traces import read_compute_trace, read_io_trace


def timeline_cmd(
    run_dir: Path | None = typer.Argument(None, help=f"a campaign run folder holding {IO_TRACE_FILE} and "
                                                     f"{COMPUTE_TRACE_FILE}"),
    io_path: Path | None = typer.Option(None, "--io", help="the io_trace file (bmoe --io-trace), instead of RUN_DIR"),
    compute_path: Path | None = typer.Option(None, "--compute", help="the compute_trace file (bmoe --compute-trace)"),
    token: int | None = typer.Option(None, "--token", help="decode token (step 1..n); default the median-wall one"),
    out: Path = typer.Option(Path("timeline.png"), "--out", "-o", help="the PNG to write"),
) -> None:
    """Draw one token's timeline: reads per lane (demand / speculative, wasted hatched) against layer compute."""
    from harness.report.timeline import median_step, timeline_png, token_view

    if run_dir is not None:
        if io_path is not None or compute_path is not None:
            raise UserError("timeline: give a RUN_DIR or --io and --compute, not both")
        io_path, compute_path = run_dir / IO_TRACE_FILE, run_dir / COMPUTE_TRACE_FILE
    if io_path is None or compute_path is None:
        raise UserError("timeline: give a run folder, or both --io FILE and --compute FILE")
    io_tr, ct = read_io_trace(io_path), read_compute_trace(compute_path)
    step = median_step(ct) if token is None else token
    atomic_write_bytes(out, timeline_png(token_view(io_tr, ct, step)))
    typer.echo(f"wrote {out} (token {step})")


def register(app: typer.Typer) -> None:
    app.command("timeline")(timeline_cmd)
