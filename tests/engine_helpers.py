"""Shared by the engine tests: generate models once, run `bmoe` as a real subprocess, read its CSV."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

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


def read_csv(path: Path) -> tuple[list[int], dict[str, float], dict[str, str]]:
    tokens: list[int] = []
    summary: dict[str, float] = {}
    pre: dict[str, str] = {}
    col = None
    for line in path.read_text().splitlines():
        if line.startswith("# summary "):
            for kv in line[len("# summary "):].split():
                k, _, v = kv.partition("=")
                summary[k] = float(v)
        elif line.startswith("# "):
            k, _, v = line[2:].partition("=")
            pre[k] = v
        elif col is None:
            col = line.split(",").index("token_id")
        else:
            tokens.append(int(line.split(",")[col]))
    return tokens, summary, pre


def bmoe(model: Path | str, *flags: str, n: int = 24, tmp: Path, env: dict[str, str] | None = None,
         prompt: str = PROMPT, prefix: list[str] | None = None) -> Run:
    csv = tmp / f"run-{len(list(tmp.glob('run-*.csv')))}.csv"
    argv = (prefix or []) + BMOE + ["-m", str(model), "-p", prompt, "-n", str(n), "-t", "2", "--csv", str(csv), *flags]
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run(argv, capture_output=True, text=True, env=e, timeout=600)
    if p.returncode == 0:
        tokens, summary, pre = read_csv(csv)
    else:
        tokens, summary, pre = [], {}, {}
    return Run(p.returncode, p.stdout, p.stderr, tokens, summary, pre)
