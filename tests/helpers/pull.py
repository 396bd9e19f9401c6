"""`bmoe pull` in this process (its real CLI entry, harness.engine.cli.main) with its output captured, and the
checks every hub test makes: one error line and no traceback; nothing half-written in the cache's snapshots."""

from __future__ import annotations

import contextlib
import io
import subprocess
from pathlib import Path


def bmoe(*argv: str) -> subprocess.CompletedProcess:
    from harness.engine.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return subprocess.CompletedProcess(list(argv), rc, out.getvalue(), err.getvalue())


def one_error(p: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    assert p.returncode == code, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("bmoe: "), p.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def snapshot_entries(home: Path) -> list[Path]:
    """Every file a user (or llama.cpp's -hf) would take for a model: the snapshots' entries that resolve."""
    return sorted(p for p in (home / "hub").rglob("snapshots/*/**/*") if p.is_file())


def blobs(home: Path) -> list[Path]:
    return sorted(p for p in (home / "hub").rglob("blobs/*"))
