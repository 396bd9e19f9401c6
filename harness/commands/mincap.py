"""`bmoe-bench mincap` (the smallest memory cap at which an engine command runs, bisected over real capped runs) and
`bmoe-bench footprint` (one capped run's memory by kind). Both need a cgroup memory controller (root here)."""

from __future__ import annotations

from pathlib import Path

import typer

_CMD_HELP = "the engine command after `--` (bmoe ... or the C++ bmoe-cli ...), with -n N; --csv is appended"


def mincap_cmd(
    cmd: list[str] = typer.Argument(..., help=_CMD_HELP),
    label: str = typer.Option(..., "--label", help="a name for this engine and its flags in the records"),
    out: Path = typer.Option(..., "--out", help="folder to append mincap.jsonl to"),
    resolution: int = typer.Option(8, "--resolution", help="MiB: caps are multiples of it; the answer is this exact"),
    lo: int = typer.Option(64, "--lo", help="MiB: the bracket's lower end (must fail)"),
    hi: int | None = typer.Option(None, "--hi", help="MiB: the bracket's upper end (must run); default the roomy "
                                                     "run's cgroup peak plus one step"),
    slowdown: float = typer.Option(2.0, "--slowdown", help="a capped run runs only at >= 1/this of its roomy "
                                                           "decode speed"),
    repeats: int = typer.Option(1, "--repeats", help="runs per cap: a cap runs only if every one ran"),
    roomy: int = typer.Option(4096, "--roomy", help="MiB: the cap of the roomy runs (speed reference)"),
    warmup: int = typer.Option(2, "--warmup", help="decode tokens left out of tok/s"),
    timeout: float | None = typer.Option(None, "--timeout", help="seconds per capped run; default 3 x slowdown x "
                                                                 "the roomy wall time, at least 60"),
    breakdown: bool = typer.Option(False, "--breakdown", help="then one more run at the minimum cap with its "
                                                              "mappings sampled (as `footprint`)"),
) -> None:
    """Find the smallest memory cap (cgroup, page cache charged) at which an engine command runs: exits 0, no OOM
    kill, inside its timeout, every token made, at least 1/slowdown of its roomy speed (harness.memcap.search)."""
    from harness.memcap.runner import Plan, find_min_cap, footprint

    p = Plan(label, list(cmd), out, resolution, slowdown, repeats, warmup, roomy, lo, hi, timeout)
    rec = find_min_cap(p, typer.echo)
    if breakdown and rec["min_cap_mib"] is not None:
        footprint(p, rec["min_cap_mib"], typer.echo)


def footprint_cmd(
    cmd: list[str] = typer.Argument(..., help=_CMD_HELP),
    cap: int = typer.Option(..., "--cap", help="MiB: the memory cap of the run"),
    label: str = typer.Option(..., "--label", help="a name for this engine and its flags in the records"),
    out: Path = typer.Option(..., "--out", help="folder to append mincap.jsonl to"),
    warmup: int = typer.Option(2, "--warmup", help="decode tokens left out of tok/s"),
    timeout: float = typer.Option(600.0, "--timeout", help="seconds"),
) -> None:
    """Run an engine command once under a cap and say where its memory went: its mappings by kind at its highest
    anonymous memory (/proc/PID/smaps) and the cgroup's charge (memory.stat: anon, file, kernel)."""
    from harness.memcap.runner import Plan, footprint

    footprint(Plan(label, list(cmd), out, warmup=warmup, timeout_s=timeout), cap, typer.echo)


def register(app: typer.Typer) -> None:
    app.command("mincap")(mincap_cmd)
    app.command("footprint")(footprint_cmd)
