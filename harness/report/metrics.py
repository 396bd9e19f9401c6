"""Read per-token metrics CSVs of both engines by column name.

bmoe writes `# bmoe_metrics v2`, `# key=value` preamble lines (engine version, every resolved knob), a
header, one row per token and a `# summary k=v ...` line per generation. The C++ BigMoeOnEdge engine's
files may have no preamble and fewer columns. -1 means "not measured" and becomes NaN here."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from harness.errors import UserError

REQUIRED = ("step", "wall_ms")
KEEP_MINUS_ONE = ("step", "steps", "turn")


@dataclass
class Metrics:
    path: str
    format: str | None  # "bmoe_metrics v2", or None for a file without a preamble
    meta: dict[str, str] = field(default_factory=dict)
    rows: pd.DataFrame = field(default_factory=pd.DataFrame)
    summaries: list[dict[str, str]] = field(default_factory=list)

    def col(self, name: str) -> np.ndarray | None:
        """A column as floats (NaN where unmeasured), or None when the file has no such column."""
        if name not in self.rows.columns:
            return None
        return self.rows[name].to_numpy(dtype=float)

    def wall_ms(self, warmup: int = 0) -> np.ndarray:
        return self.rows["wall_ms"].to_numpy(dtype=float)[warmup:]


def _kv(text: str) -> dict[str, str]:
    out = {}
    for tok in text.split():
        if "=" in tok:
            k, v = tok.split("=", 1)
            out[k] = v
    return out


def parse_metrics(text: str, path: str = "<text>") -> Metrics:
    fmt: str | None = None
    meta: dict[str, str] = {}
    summaries: list[dict[str, str]] = []
    body: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            s = line[1:].strip()
            if s.startswith("bmoe_metrics"):
                fmt = s
            elif s.startswith("summary"):
                summaries.append(_kv(s[len("summary"):]))
            elif "=" in s:
                k, v = s.split("=", 1)
                meta[k.strip()] = v.strip()
            continue
        if line.strip():
            body.append(line)
    if fmt is not None and fmt.split()[-1] not in ("v1", "v2"):
        raise UserError(f"{path}: {fmt} is newer than this bmoe-bench reads (v2); upgrade bmoe")
    if not body:
        raise UserError(f"{path}: no header or rows: not a metrics CSV, or the engine wrote nothing")
    try:
        df = pd.read_csv(io.StringIO("\n".join(body)))
    except (pd.errors.ParserError, ValueError) as e:
        raise UserError(f"{path}: unreadable CSV body ({str(e).splitlines()[0]})") from None
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise UserError(f"{path}: no {missing[0]} column: not a bmoe_metrics CSV")
    for c in df.columns:
        if c not in KEEP_MINUS_ONE and pd.api.types.is_numeric_dtype(df[c]):
            df[c] = df[c].astype(float).where(df[c] != -1, np.nan)
    return Metrics(path=path, format=fmt, meta=meta, rows=df, summaries=summaries)


def read_metrics(path: Path | str) -> Metrics:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    return parse_metrics(text, str(path))
