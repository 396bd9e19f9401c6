"""The fidelity files: `bmoe_fidelity_ref v1`, a reference run's log-probabilities on a fixed token sequence
(`bmoe --fidelity-ref`), and `bmoe_fidelity v1`, a run's per-position figures against it (`bmoe
--fidelity-against REF --fidelity-csv PATH`). What the numbers mean is harness.kld's; this module only stores them.

`bmoe_fidelity_ref v1` (binary after two text lines):

    # bmoe_fidelity_ref v1
    # {"arch": ..., "n_vocab": V, "ctx": C, "first": F, "n_chunk": N, "top_k": K, "bos": B, ...}   (JSON, one line)
    tokens    int32[N * C]     the scored text's tokens, chunk after chunk (llama.cpp's layout: a chunk's first
                               token is replaced by B, the BOS token, when B >= 0)
    N * (C - 1 - F) rows, one per scored position (positions F .. C-2 of each chunk, predicting F+1 .. C-1):
      ids     int32[K]         the reference's top K tokens, most probable first
      lp      float32[K]       their natural log-probabilities
      tail_lp float32          log of the probability mass of every other token (-inf when K is the vocabulary)
      next_lp float32          log-probability of the text's next token

All little-endian. K = V keeps the whole vocabulary (exact KLD); harness.kld says what a smaller K loses.

`bmoe_fidelity v2` (CSV): `# bmoe_fidelity v2`, `# key=value` preamble lines (the reference, the run's knobs), the
header, one row per scored position:

    chunk,pos,token,ref_top,run_top,same_top,kld,p_ref,p_run,dp,lp_ref,lp_run,hit

`pos` is the position in its chunk whose logits predict `token` (at pos + 1); kld in nats; p_* the next token's
probability; dp = p_run - p_ref; lp_* the next token's natural log-probability (float32 values written exactly:
perplexity is exp(-mean lp)); hit is 1 when the run's most probable token is `token` (next-token accuracy).
v1 files (bmoe before --fidelity-decode) lack the last three columns; the reader gives what a file has.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.errors import UserError
from harness.formats.folder_guard import MAX_RAW, loads, read_capped

REF_FORMAT = "bmoe_fidelity_ref"
REF_VERSION = 1
CSV_FORMAT = "bmoe_fidelity"
CSV_VERSION = 2
COLUMNS = ["chunk", "pos", "token", "ref_top", "run_top", "same_top", "kld", "p_ref", "p_run", "dp", "lp_ref", "lp_run",
           "hit"]
COLUMNS_V1 = COLUMNS[:10]
FLOAT_COLUMNS = ("kld", "p_ref", "p_run", "dp", "lp_ref", "lp_run")
_HEADER_KEYS = ("n_vocab", "ctx", "first", "n_chunk", "top_k", "bos")
MAX_REF = 2**30  # bytes of a reference read (one of 5 MB scores 2394 positions at top 256)


def row_dtype(k: int) -> np.dtype:
    return np.dtype([("ids", "<i4", (k,)), ("lp", "<f4", (k,)), ("tail_lp", "<f4"), ("next_lp", "<f4")])


def scored_per_chunk(ctx: int, first: int) -> int:
    return ctx - 1 - first


@dataclass
class RefFile:
    """A read reference: its header (dict, the keys above and the run's description), tokens (n_chunk, ctx)
    int32, and the rows (a structured array of row_dtype(top_k), n_chunk * (ctx - 1 - first) long)."""

    path: str
    header: dict
    tokens: np.ndarray
    rows: np.ndarray

    @property
    def ctx(self) -> int:
        return int(self.header["ctx"])

    @property
    def first(self) -> int:
        return int(self.header["first"])

    def chunk_rows(self, c: int) -> np.ndarray:
        n = scored_per_chunk(self.ctx, self.first)
        return self.rows[c * n:(c + 1) * n]


class RefWriter:
    """Writes the header and tokens at open, then the rows chunk by chunk, into a temporary sibling renamed over
    `path` by `close()` (a killed run leaves no half reference)."""

    def __init__(self, path: str | Path, header: dict, tokens: np.ndarray):
        for k in _HEADER_KEYS:
            if k not in header:
                raise ValueError(f"reference header without {k}")
        self.path = Path(path)
        self.k = int(header["top_k"])
        self.expected = int(header["n_chunk"]) * scored_per_chunk(int(header["ctx"]), int(header["first"]))
        self.written = 0
        self.tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.f = open(self.tmp, "wb")
        except OSError as e:
            raise UserError(f"--fidelity-ref {path}: cannot write it ({e.strerror}); give a writable path") from None
        self.f.write(f"# {REF_FORMAT} v{REF_VERSION}\n# {json.dumps(header, sort_keys=True)}\n".encode())
        self.f.write(np.ascontiguousarray(tokens, dtype="<i4").tobytes())

    def rows(self, ids: np.ndarray, lp: np.ndarray, tail_lp: np.ndarray, next_lp: np.ndarray) -> None:
        r = np.zeros(len(ids), dtype=row_dtype(self.k))
        r["ids"], r["lp"], r["tail_lp"], r["next_lp"] = ids, lp, tail_lp, next_lp
        self.f.write(r.tobytes())
        self.written += len(r)

    def close(self) -> None:
        self.f.close()
        if self.written != self.expected:
            self.tmp.unlink(missing_ok=True)
            raise ValueError(f"reference {self.path}: {self.written} rows written, {self.expected} declared")
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self.f.close()
        self.tmp.unlink(missing_ok=True)


def read_ref_header(path: str | Path) -> dict:
    """The header only (the CLI reads it before the load: the context size)."""
    return _read_ref(path, header_only=True).header


def read_ref(path: str | Path) -> RefFile:
    return _read_ref(path, header_only=False)


def _read_ref(path: str | Path, header_only: bool) -> RefFile:
    what = f"--fidelity-against {path}"
    try:
        data = read_capped(path, MAX_REF)
    except OSError as e:
        raise UserError(f"{what}: cannot read it ({e.strerror}); give a reference written by "
                        "bmoe --fidelity-ref") from None
    lines = data.split(b"\n", 2)
    first = lines[0].decode("utf-8", "replace")
    if len(lines) < 3 or not first.startswith(f"# {REF_FORMAT} v"):
        raise UserError(f"{what}: not a {REF_FORMAT} file (first line {first[:60]!r}); write one with "
                        "bmoe --fidelity-ref OUT -p TEXT")
    version = first.split(" v", 1)[1].strip()
    if version != str(REF_VERSION):
        raise UserError(f"{what}: {REF_FORMAT} v{version} is not v{REF_VERSION}, the version this bmoe reads; "
                        "score the reference again with this bmoe")
    try:
        header = loads(lines[1].decode()[2:], what)
        ctx, first_pos, n_chunk, k = (int(header[x]) for x in ("ctx", "first", "n_chunk", "top_k"))
    except (ValueError, KeyError, TypeError):
        raise UserError(f"{what}: its header line is damaged; score the reference again") from None
    body = lines[2]
    n_tok, n_rows = n_chunk * ctx, n_chunk * scored_per_chunk(ctx, first_pos)
    dt = row_dtype(k)
    if len(body) != 4 * n_tok + n_rows * dt.itemsize:
        raise UserError(f"{what}: {len(body)} bytes of data where its header declares "
                        f"{4 * n_tok + n_rows * dt.itemsize} (truncated or damaged); score the reference again")
    if header_only:
        return RefFile(str(path), header, np.zeros((0, ctx), np.int32), np.zeros(0, dt))
    tokens = np.frombuffer(body, dtype="<i4", count=n_tok).reshape(n_chunk, ctx)
    rows = np.frombuffer(body, dtype=dt, offset=4 * n_tok, count=n_rows)
    return RefFile(str(path), header, tokens, rows)


# -- the per-position CSV --------------------------------------------------------------------------------------


class FidelityCsvWriter:
    def __init__(self, path: str | Path, preamble: dict[str, object]):
        try:
            self.f = open(path, "w", newline="")
        except OSError as e:
            raise UserError(f"--fidelity-csv {path}: cannot write it ({e.strerror}); give a writable path") from None
        self.f.write(f"# {CSV_FORMAT} v{CSV_VERSION}\n")
        for k, v in preamble.items():
            self.f.write(f"# {k}={str(v).replace(chr(10), ' ')}\n")
        self.w = csv.writer(self.f, lineterminator="\n")
        self.w.writerow(COLUMNS)

    def rows(self, chunk: int, first: int, tokens: np.ndarray, ref_top: np.ndarray, run_top: np.ndarray,
             kld: np.ndarray, p_ref: np.ndarray, p_run: np.ndarray, lp_ref: np.ndarray, lp_run: np.ndarray) -> None:
        for j in range(len(kld)):
            self.w.writerow([chunk, first + j, int(tokens[j]), int(ref_top[j]), int(run_top[j]),
                             int(ref_top[j] == run_top[j]), repr(float(kld[j])), repr(float(p_ref[j])),
                             repr(float(p_run[j])), repr(float(p_run[j] - p_ref[j])), repr(float(lp_ref[j])),
                             repr(float(lp_run[j])), int(run_top[j] == tokens[j])])

    def close(self) -> None:
        self.f.close()


@dataclass
class FidelityCsv:
    meta: dict[str, str]
    columns: dict[str, np.ndarray]  # name -> values (ints for the id columns, floats for the rest)


def read_fidelity_csv(path: str | Path) -> FidelityCsv:
    meta: dict[str, str] = {}
    try:
        text = read_capped(path, MAX_RAW).decode("utf-8", "replace")
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    head, *lines = text.splitlines(keepends=True) or [""]
    head = head.strip()
    versions = {f"# {CSV_FORMAT} v{v}": v for v in (1, CSV_VERSION)}
    if head not in versions:
        raise UserError(f"{path}: not a {CSV_FORMAT} v1 or v{CSV_VERSION} file (first line {head[:60]!r})")
    names = COLUMNS if versions[head] == CSV_VERSION else COLUMNS_V1
    body = []
    for ln in lines:
        if ln.startswith("# "):
            k, _, v = ln[2:].rstrip("\n").partition("=")
            meta[k] = v
        else:
            body.append(ln)
    rows = list(csv.reader(body))
    if not rows or rows[0] != names:
        raise UserError(f"{path}: the header is not {','.join(names)}")
    data = rows[1:]
    if any(len(r) != len(names) for r in data):
        raise UserError(f"{path}: a row without {len(names)} fields (truncated or damaged)")
    cols: dict[str, np.ndarray] = {}
    for i, name in enumerate(names):
        kind = float if name in FLOAT_COLUMNS else int
        cols[name] = np.array([kind(r[i]) for r in data], dtype=np.float64 if kind is float else np.int64)
    return FidelityCsv(meta, cols)
