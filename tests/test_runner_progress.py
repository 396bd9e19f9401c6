"""The campaign's progress display: the ETA from finished runs, and the line printed per finished run."""

from io import StringIO

from folder_helpers import outcome
from rich.console import Console

from harness.campaigns.progress import RunProgress, eta_text
from harness.formats.outcome import GateRecord


def test_eta_from_finished_runs():
    assert eta_text([], 5, 0) == "ETA after the first run"
    assert eta_text([60.0, 120.0], 4, 0) == "ETA 6m00s"  # 4 x 90 s
    assert eta_text([60.0, 120.0], 4, 30.0) == "ETA 5m30s"  # 30 s into the current one
    assert eta_text([3600.0], 2, 0) == "ETA 2h00m"


def test_one_line_per_finished_run():
    out = StringIO()
    prog = RunProgress(Console(file=out, width=200), total_runs=2, done_runs=0, n_cells=2, tokens=5,
                       clock=lambda: 0.0)
    with prog:
        prog.start_run("r01-c00", "base", 1, 1, 0)
        prog.end_run("r01-c00", "base", outcome(tok_s_all=12.5, wall_s=1.5, gate=GateRecord(
            waited_s=4.0, gave_up=False, reason="cpu 70.0 C > 60 C", unchecked=[])))
        prog.start_run("r01-c01", "--x=on", 1, 1, 1)
        prog.end_run("r01-c01", "--x=on", outcome("failed", reason="engine exited 3: boom"))
    lines = [ln for ln in out.getvalue().splitlines() if ": ok, " in ln or ": failed: " in ln]  # not the bars
    assert lines == ["r01-c00 base: ok, 5 tokens, 12.5 tok/s (all tokens), 1.5 s, gate: cpu 70.0 C > 60 C",
                     "r01-c01 --x=on: failed: engine exited 3: boom"]
