"""A small campaign for the runner tests, run by tests/fixtures/fake_engine.py (a real process writing a
real bmoe_metrics v2 CSV and BMOE_PROGRESS lines through harness.formats)."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from io import StringIO
from pathlib import Path

from rich.console import Console

FAKE = Path(__file__).resolve().parents[1] / "fixtures" / "fake_engine.py"
BENCH = [sys.executable, "-m", "harness.bench_cli"]


def engine(tmp_path: Path) -> Path:
    exe = tmp_path / "fake-engine"
    exe.write_text(f"#!{sys.executable}\n" + FAKE.read_text())
    exe.chmod(0o755)
    return exe


def campaign(tmp_path: Path, *, fail_axis: bool = False, repeats: int = 2, sleep_ms: int = 0, tokens: int = 6,
             name: str = "t") -> Path:
    """Two cells (base, --speed 20), plus a third that exits 3 after one token with fail_axis."""
    exe = engine(tmp_path)
    model = tmp_path / "model.bin"
    model.write_bytes(b"\0" * 4096)
    p = tmp_path / f"{name}.yaml"
    p.write_text(textwrap.dedent(f"""\
        name: {name}
        model: {{path: {model}}}
        engine: {{kind: external, path: {exe}}}
        flags: {{--speed: 10, --sleep-ms: {sleep_ms}}}
        repeats: {repeats}
        tokens: {tokens}
        warmup_tokens: 1
        cooldown: {{mem_available_min_mib: 64, max_wait_s: 5}}
        timeout_s: 60
        axes:
          - flag: --speed
            values: [20]
        """) + ("  - {flag: --fail, values: [3]}\n" if fail_axis else ""))
    return p


def quiet() -> Console:
    return Console(file=StringIO(), width=100)


def wait_for(pred, timeout=60.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError("timed out")


def finished(folder: Path) -> list[dict]:
    """The finished runs of a manifest being rewritten by another process (raw JSON: it may be mid-write)."""
    try:
        m = json.loads((folder / "manifest.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return []
    return [r for r in m["runs"] if r["status"] != "pending"]
