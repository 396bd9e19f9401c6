"""`bmoe_metrics v2`: the per-token CSV both engines write and the report reads.

Layout: a `# bmoe_metrics v2` line, `# key=value` preamble lines (engine version, every resolved knob),
a header, one row per token, and a `# summary k=v ...` line after each generation. The schema is
`TokenRow`: its fields are the columns, in order, with their units in the names. `compute_ms` is the
residual wall - stall - mgmt (the writer's preamble says so). A value that was not measured is written
as -1, never 0, and read back as NaN. Readers go by column name: older files and the C++ engine's have
fewer columns, and may have no preamble; its preamble lines (after `# engine=<version>`) carry several
`key=value` each, read as separate keys.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterator
from dataclasses import astuple, dataclass, field, fields
from pathlib import Path
from typing import IO, TYPE_CHECKING

import numpy as np

from harness.errors import UserError
from harness.formats.folder_guard import MAX_RAW, capped_lines

if TYPE_CHECKING:
    import pandas as pd

FORMAT = "bmoe_metrics"
VERSION = 2
READABLE = ("v1", "v2")
UNMEASURED = -1


@dataclass
class TokenRow:
    """One decoded token. Times in ms, sizes in bytes or MiB as named; -1 = unmeasured."""

    step: int
    steps: int
    wall_ms: float
    io_ms: float = UNMEASURED
    compute_ms: float = UNMEASURED
    read_bytes: int = UNMEASURED
    cache_hit_pct: float = UNMEASURED
    stall_ms: float = UNMEASURED
    mgmt_ms: float = UNMEASURED
    majflt: int = UNMEASURED
    cpu_ms: float = UNMEASURED
    dense_resident_frac: float = UNMEASURED
    turn: int = 0
    majflt_mib: float = UNMEASURED
    cache_budget_mib: float = UNMEASURED
    rss_mib: float = UNMEASURED
    rss_anon_mib: float = UNMEASURED
    rss_file_mib: float = UNMEASURED
    swap_mib: float = UNMEASURED
    mem_available_mib: float = UNMEASURED
    mem_free_mib: float = UNMEASURED
    swap_free_mib: float = UNMEASURED
    loop_overhead_ms: float = UNMEASURED
    token_id: int = UNMEASURED
    mem_stall_ms: float = UNMEASURED  # memory-pressure stall (PSI `some`) during the token; source in preamble
    prefetch_bytes: int = UNMEASURED  # speculative reads completed (--prefetch, --predict-prefetch); logical bytes
    prefetch_used_bytes: int = UNMEASURED  # prefetched experts a demand lookup used (each once)
    prefetch_wasted_bytes: int = UNMEASURED  # prefetched experts evicted before any use
    route_agree: float = UNMEASURED  # --route-ahead: share of the committed slots in their layer's own top-k
    # guess-ahead (--ngram): on the first token of a verify batch, the guesses it carried and how many of them
    # were kept; 0 on the kept guesses' own rows; -1 without guess-ahead
    draft_proposed: int = UNMEASURED
    draft_accepted: int = UNMEASURED
    mgmt_cpu_ms: float = UNMEASURED  # the compute thread's own CPU time inside mgmt_ms (mgmt_ms is wall time)
    # of mgmt_ms, the time spent while demand reads were in flight that the token then waited for (a wait over
    # 50 us right after): hidden behind I/O, off the critical path; mgmt_ms - mgmt_hidden_ms is exposed
    mgmt_hidden_ms: float = UNMEASURED
    # CPU time of the decode evictions decided on the evictor's helper thread (off the compute thread, so not in
    # mgmt_ms or mgmt_cpu_ms; the compute thread's wait for it is in mgmt_ms); -1 where not measured
    mgmt_bg_cpu_ms: float = UNMEASURED


COLUMNS: list[str] = [f.name for f in fields(TokenRow)]
REQUIRED = ("step", "wall_ms")
KEEP_MINUS_ONE = ("step", "steps", "turn")  # -1 is a value here, not "unmeasured"


def escape(v: object) -> str:
    """Preamble values stay on one line: backslash, CR and LF are escaped."""
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


def _fmt(v: object) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


@dataclass
class Summary:
    """The end-of-generation summary: the `# summary` line's fields, and the engine's stderr line."""

    n_decode: int = 0
    decode_s: float = 0.0
    n_prompt: int = 0
    prefill_s: float = 0.0
    ttft_s: float = 0.0
    load_s: float = 0.0
    read_bytes: int = 0
    hit_pct: float | None = None
    cache_resident_mib: float | None = None
    evictions: int | None = None
    draft_groups: int | None = None  # guess-ahead: verify batches that carried guesses (None = off)
    draft_proposed: int | None = None  # guesses made
    draft_accepted: int | None = None  # guesses kept (each one a token decoded without a decode of its own)
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def decode_tok_s(self) -> float:
        return self.n_decode / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def prefill_tok_s(self) -> float:
        return self.n_prompt / self.prefill_s if self.prefill_s > 0 else 0.0

    def fields(self) -> dict[str, object]:
        d: dict[str, object] = {
            "decode_tok_s": round(self.decode_tok_s, 4),
            "prefill_tok_s": round(self.prefill_tok_s, 4),
            "ttft_ms": round(self.ttft_s * 1e3, 3),
            "load_ms": round(self.load_s * 1e3, 3),
            "n_prompt": self.n_prompt,
            "n_decode": self.n_decode,
            "mib_read_per_token": round(self.read_bytes / 1048576 / max(self.n_decode, 1), 4),
            "hit_pct": UNMEASURED if self.hit_pct is None else round(self.hit_pct, 3),
            "cache_resident_mib": UNMEASURED if self.cache_resident_mib is None else round(self.cache_resident_mib, 3),
            "evictions": UNMEASURED if self.evictions is None else self.evictions,
        }
        if self.draft_proposed is not None:
            d.update(draft_groups=self.draft_groups, draft_proposed=self.draft_proposed,
                     draft_accepted=self.draft_accepted,
                     draft_accept_pct=round(100 * (self.draft_accepted or 0) / self.draft_proposed, 3)
                     if self.draft_proposed else UNMEASURED)
        d.update(self.extra)
        return d

    def human(self) -> str:
        f = self.fields()
        parts = [
            f"decode {f['decode_tok_s']:.2f} tok/s ({self.n_decode} tokens)",
            f"prefill {f['prefill_tok_s']:.2f} tok/s ({self.n_prompt} tokens)",
            f"TTFT {f['ttft_ms']:.0f} ms",
            f"load {f['load_ms']:.0f} ms",
            f"{f['mib_read_per_token']:.2f} MiB read/token",
        ]
        if self.hit_pct is not None:
            parts.append(f"hit {self.hit_pct:.1f}%")
            parts.append(f"cache resident {self.cache_resident_mib:.0f} MiB")
            parts.append(f"{self.evictions} evictions")
        if self.draft_proposed is not None:
            parts.append(f"guesses kept {self.draft_accepted}/{self.draft_proposed}")
        return "bmoe: " + ", ".join(parts)


class MetricsWriter:
    """Writes the preamble at open, one row per token (line-buffered: a killed engine leaves whole rows),
    and a `# summary` line per generation."""

    def __init__(self, path: str | Path, preamble: dict[str, object]):
        self.path = str(path)
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self.f: IO[str] = open(self.path, "w", buffering=1)
        self.f.write(f"# {FORMAT} v{VERSION}\n")
        for k, v in preamble.items():
            self.f.write(f"# {k}={escape(v)}\n")
        self.f.write(",".join(COLUMNS) + "\n")

    def row(self, r: TokenRow) -> None:
        self.f.write(",".join(_fmt(v) for v in astuple(r)) + "\n")

    def summary(self, s: Summary) -> None:
        self.f.write("# summary " + " ".join(f"{k}={v}" for k, v in s.fields().items()) + "\n")

    def close(self) -> None:
        self.f.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Metrics:
    """A metrics CSV as read: its format line, preamble, token rows (-1 as NaN) and summaries."""

    path: str
    format: str | None  # "bmoe_metrics v2", or None for a file without a preamble
    meta: dict[str, str] = field(default_factory=dict)
    rows: pd.DataFrame = field(default_factory=lambda: _pd().DataFrame())
    summaries: list[dict[str, str]] = field(default_factory=list)
    cut_last_row: bool = False  # the last row is cut short (no final newline, or fewer fields than the header)

    def problem(self, expected_rows: int | None) -> str | None:
        """Why this file cannot stand for a finished run that recorded `expected_rows` tokens, or None:
        a last row cut short, a row count that differs, no `# summary` line, an unmeasured wall_ms."""
        if self.cut_last_row:
            return f"{self.path}: its last row is cut short (the file was truncated)"
        if expected_rows is not None and len(self.rows) != expected_rows:
            return (f"{self.path}: {len(self.rows)} token rows, but the run recorded {expected_rows} "
                    f"(the file was truncated or changed)")
        if not self.summaries:
            return f"{self.path}: no '# summary' line (the file was truncated, or the engine did not finish)"
        for c in REQUIRED:
            bad = int(_pd().to_numeric(self.rows[c], errors="coerce").isna().sum())
            if bad:
                return f"{self.path}: {c} is missing or not a number in {bad} row(s)"
        return None

    def col(self, name: str) -> np.ndarray | None:
        """A column as floats (NaN where unmeasured), or None when the file has no such column."""
        if name not in self.rows.columns:
            return None
        return self.rows[name].to_numpy(dtype=float)

    def wall_ms(self, warmup: int = 0) -> np.ndarray:
        return self.rows["wall_ms"].to_numpy(dtype=float)[warmup:]

    def token_ids(self) -> list[int]:
        """The generated token ids in order (bmoe's own files; empty when the column is absent)."""
        if "token_id" not in self.rows.columns:
            return []
        return [int(x) for x in self.rows["token_id"].to_numpy(dtype=float)]

    def summary(self, i: int = -1) -> dict[str, float]:
        """One `# summary` line's fields as numbers (the last one by default)."""
        if not self.summaries:
            raise UserError(f"{self.path}: no '# summary' line: the engine did not finish this generation")
        return {k: float(v) for k, v in self.summaries[i].items()}


_AGREE_L = re.compile(r"predict_agree_l(\d+)$")


def early_router_recall(summary: dict[str, float]) -> tuple[float | None, dict[int, float], float]:
    """A --predict-prefetch run's `# summary` fields read as the early router's recall: the whole run's
    (`predict_agree`, None when unmeasured), each layer's (`predict_agree_l<L>`, unmeasured ones left out), and the
    MiB of speculative reads it wasted (`prefetch_wasted_mib`, 0 when absent or unmeasured)."""
    whole = summary.get("predict_agree", -1)
    layers = {int(m.group(1)): v for k, v in summary.items() if (m := _AGREE_L.match(k)) and v >= 0}
    return (whole if whole >= 0 else None), layers, max(summary.get("prefetch_wasted_mib", 0.0), 0.0)


def _kv(text: str) -> dict[str, str]:
    out = {}
    for tok in text.split():
        if "=" in tok:
            k, v = tok.split("=", 1)
            out[k] = v
    return out


def parse_metrics(text: str, path: str = "<text>") -> Metrics:
    return _parse(iter(text.splitlines(keepends=True)), path)


def read_metrics(path: Path | str) -> Metrics:
    """A metrics file streamed into pandas through _Body, refused past MAX_RAW bytes. Measured on a 60 MB file
    (491,280 rows): peak RSS 300 MiB, against 621 MiB when the whole text was read first and then parsed."""
    def lines() -> Iterator[str]:
        try:
            for raw in capped_lines(path, MAX_RAW):
                yield raw.decode("utf-8", "replace")
        except OSError as e:
            raise UserError(f"{path}: cannot read ({e.strerror})") from None
    return _parse(lines(), str(path))


class _Head:
    """What the comment lines say: the format line, key=value lines, `# summary` lines."""

    def __init__(self) -> None:
        self.fmt: str | None = None
        self.meta: dict[str, str] = {}
        self.summaries: list[dict[str, str]] = []

    def comment(self, line: str) -> None:
        s = line[1:].strip()
        if s.startswith(FORMAT):
            self.fmt = s
        elif s.startswith("summary"):
            self.summaries.append(_kv(s[len("summary"):]))
        elif "=" in s:
            if self.meta.get("engine", "bmoe") != "bmoe" and all("=" in t for t in s.split()):
                self.meta.update(_kv(s))  # the C++ engine writes several key=value per preamble line
            else:
                k, v = s.split("=", 1)
                self.meta[k.strip()] = v.strip()


class _Body(io.TextIOBase):
    """The CSV body as pandas reads it, pulled line by line: comment lines go to the _Head on the way and blank
    ones are dropped, so the file is never held as a whole besides the table pandas builds. Remembers what tells a
    cut last row: the last line without its newline, or a field count other than the header's."""

    def __init__(self, lines: Iterator[str], header: str, head: _Head):
        self.lines, self.head, self.header = lines, head, header
        self.pending: str | None = header
        self.n = 0  # body lines, the header included
        self.last = header
        self.last_line_is_body = True  # the file's last line is a body line (not a comment)

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> str:
        out: list[str] = []
        got = 0
        while size is None or size < 0 or got < size:
            line = self.pending if self.pending is not None else next(self.lines, None)
            self.pending = None
            if line is None:
                break
            if line.startswith("#"):
                self.head.comment(line)
                self.last_line_is_body = False
                continue
            if not line.strip():
                continue
            self.n += 1
            self.last, self.last_line_is_body = line, True
            out.append(line if line.endswith("\n") else line + "\n")
            got += len(out[-1])
        return "".join(out)

    def cut(self) -> bool:
        return self.n > 1 and ((self.last_line_is_body and not self.last.endswith("\n"))
                               or self.last.count(",") != self.header.count(","))


def _parse(lines: Iterator[str], path: str) -> Metrics:
    pd = _pd()
    head = _Head()
    header = None
    for line in lines:
        if line.startswith("#"):
            head.comment(line)
        elif line.strip():
            header = line
            break
    if head.fmt is not None and head.fmt.split()[-1] not in READABLE:
        raise UserError(f"{path}: {head.fmt} is newer than this bmoe-bench reads (v{VERSION}); upgrade bmoe")
    if header is None:
        raise UserError(f"{path}: no header or rows: not a metrics CSV, or the engine wrote nothing")
    body = _Body(lines, header, head)
    try:
        df = pd.read_csv(body)
    except (pd.errors.ParserError, ValueError) as e:
        raise UserError(f"{path}: unreadable CSV body ({str(e).splitlines()[0]})") from None
    body.read()  # the comment lines after the last row pandas asked for (the summaries)
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise UserError(f"{path}: no {missing[0]} column: not a bmoe_metrics CSV")
    num = [c for c in df.columns if c not in KEEP_MINUS_ONE and pd.api.types.is_numeric_dtype(df[c])]
    if num:  # -1 (unmeasured) -> NaN, every numeric column at once (column by column it was half a run's harness time)
        vals = df[num].to_numpy(dtype=float, copy=True)
        vals[vals == -1] = np.nan
        df[num] = vals
    return Metrics(path=path, format=head.fmt, meta=head.meta, rows=df, summaries=head.summaries,
                   cut_last_row=body.cut())


def _pd():
    """pandas, imported when a file is read: the engine only writes these files, and pandas is 26 MiB of a capped
    engine's anonymous memory (bench-data/2026-12-03-mincap)."""
    import pandas

    return pandas
