"""Shared by the engine tests: generate models once, run `bmoe` as a real subprocess, read its CSV."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.formats.metrics_csv import read_metrics

BMOE = [sys.executable, "-m", "harness.engine.cli"]
PROMPT = "The expert cache keeps hot experts near."


@dataclass
class Run:
    rc: int
    stdout: str
    stderr: str
    tokens: list[int]
    summary: dict[str, float]
    preamble: dict[str, str]
    csv: Path | None = None


def read_csv(path: Path) -> tuple[list[int], dict[str, float], dict[str, str]]:
    m = read_metrics(path)
    return m.token_ids(), m.summary(), m.meta


def bmoe(model: Path | str, *flags: str, n: int = 24, tmp: Path, env: dict[str, str] | None = None,
         prompt: str = PROMPT, prefix: list[str] | None = None) -> Run:
    tmp.mkdir(parents=True, exist_ok=True)  # bmoe refuses an output path whose directory does not exist
    csv = tmp / f"run-{len(list(tmp.glob('run-*.csv')))}.csv"
    argv = (prefix or []) + BMOE + ["-m", str(model), "-p", prompt, "-n", str(n), "-t", "2", "--csv", str(csv), *flags]
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run(argv, capture_output=True, text=True, errors="replace", env=e, timeout=600)
    if p.returncode == 0:
        tokens, summary, pre = read_csv(csv)
    else:
        tokens, summary, pre = [], {}, {}
    return Run(p.returncode, p.stdout, p.stderr, tokens, summary, pre, csv)
