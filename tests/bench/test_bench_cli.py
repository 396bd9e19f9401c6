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
