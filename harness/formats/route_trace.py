"""`route_trace v2` (and v1): which experts every token routed to, layer by layer, as the engine recorded them.

Layout: a `# route_trace v2` line; `# model=... arch=... n_layer=N n_expert=E n_expert_used=K`; one
`# layer=i expert_bytes=B dense_bytes=D` line per layer; the column header; then one row per routed
expert:

    turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped

`phase` is 0 for the prompt (prefill) and 1 for a generated token (decode); `slot` is the expert's rank
among the token's K; `weight` is the router's weight for the slot as the model computed it (after its own
normalisation and scale, before any drop; -1 when unmeasured); `residency` is what the engine's cache found
(0 miss, 1 hit, 2 prefetched); `dropped` is 1 when the engine skipped the expert (`--drop-cold-experts`: its
weight was zeroed, it was not read). v1 files (no `dropped` column: nothing dropped) are read as well; the
C++ engine writes v1. Readers take the per-layer expert size from the header, so the `weight` and per-row
`expert_bytes` columns are not read back.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from harness.errors import TraceFormatError, UserError

FORMAT = "route_trace"
VERSION = 2
READS = ("v1", "v2")  # versions the reader accepts
COLUMNS = ["turn", "phase", "step", "layer", "slot", "expert", "weight", "residency", "expert_bytes", "dropped"]
COLUMNS_V1 = COLUMNS[:9]
UNMEASURED = -1
PREFILL, DECODE = 0, 1
_KV = re.compile(r"(\w+)=(\S*)")


@dataclass(frozen=True)
class TraceHeader:
    model: str
    arch: str
    n_layer: int
    n_expert: int
    k: int  # n_expert_used: experts per token per layer
    expert_bytes: list[int]  # per layer: bytes of one expert
    dense_bytes: list[int]  # per layer: bytes of the non-expert tensors


class Route(NamedTuple):
    """One row: one expert one token routed to in one layer. `line` is its 1-based line in the file."""

    turn: int
    phase: int
    step: int
    layer: int
    slot: int
    expert: int
    residency: int
    line: int
    dropped: int = 0  # 1: skipped by --drop-cold-experts (v2); v1 rows are 0


@dataclass
class RouteTraceFile:
    name: str  # the file name without .route.csv
    header: TraceHeader
    rows: list[Route]
    has_dropped: bool = False  # v2: the dropped column exists (v1 traces cannot say)


# ---- writer ------------------------------------------------------------------------------------------------

class RouteTraceWriter:
    """Writes the header at open, then the rows of each batch of routing events the engine's hook saw
    (objects with `.layer`, `.phase`, `.ids` (a (tokens, K) array), `.residency` {expert: 0|1|2}, and
    `.weights` (a (tokens, K) float array or None: -1) and `.dropped` (a (tokens, K) bool array or None))."""

    def __init__(self, path: str, model: str, arch: str, n_layer: int, n_expert: int, k: int,
                 expert_bytes: list[int], dense_bytes: dict[int, int]):
        self.f = open(path, "w")
        self.f.write(f"# {FORMAT} v{VERSION}\n")
        self.f.write(f"# model={model} arch={arch} n_layer={n_layer} n_expert={n_expert} n_expert_used={k}\n")
        for il in range(n_layer):
            self.f.write(f"# layer={il} expert_bytes={expert_bytes[il]} dense_bytes={dense_bytes.get(il, 0)}\n")
        self.f.write(",".join(COLUMNS) + "\n")
        self.expert_bytes = expert_bytes

    def events(self, turn: int, step: int, events) -> None:
        """A prefill event's token j is step + j; a decode event's only token is `step`."""
        w = self.f.write
        for ev in events:
            eb = self.expert_bytes[ev.layer]
            weights = getattr(ev, "weights", None)
            dropped = getattr(ev, "dropped", None)
            for tok, row in enumerate(ev.ids.tolist()):
                st = step + tok if ev.phase == PREFILL else step
                ws = [f"{x:.6g}" for x in weights[tok].tolist()] if weights is not None else None
                ds = dropped[tok].tolist() if dropped is not None else None
                for slot, e in enumerate(row):
                    wt = ws[slot] if ws is not None else UNMEASURED
                    d = int(ds[slot]) if ds is not None else 0
                    res = 0 if d else ev.residency.get(e, 0)
                    w(f"{turn},{ev.phase},{st},{ev.layer},{slot},{e},{wt},{res},{eb},{d}\n")

    def close(self) -> None:
        self.f.close()


# ---- reader ------------------------------------------------------------------------------------------------

def _header(lines: list[str]) -> tuple[TraceHeader, int, bool]:
    if not lines or not lines[0].startswith(f"# {FORMAT}"):
        raise TraceFormatError(f"first line is not '# {FORMAT} v{VERSION}'")
    version = lines[0].split()[-1]
    if version not in READS:
        raise TraceFormatError(f"{FORMAT} version {version!r} is not supported (this reader knows "
                               f"{' and '.join(READS)})")
    hdr = next((i for i, line in enumerate(lines) if not line.startswith("#")), None)
    if hdr is None:
        raise TraceFormatError("no column header after the comment lines")
    meta: dict[str, str] = {}
    layer_bytes: dict[int, tuple[int, int]] = {}
    for line in lines[1:hdr]:
        kv = dict(_KV.findall(line))
        try:
            if "layer" in kv and "expert_bytes" in kv:
                layer_bytes[int(kv["layer"])] = (int(kv["expert_bytes"]), int(kv.get("dense_bytes", 0)))
            else:
                meta.update(kv)
        except ValueError:
            raise TraceFormatError(f"bad header line {line!r}") from None
    for key in ("n_layer", "n_expert", "n_expert_used"):
        if key not in meta:
            raise TraceFormatError(f"header lacks {key}=")
    try:
        n_layer, n_expert, k = int(meta["n_layer"]), int(meta["n_expert"]), int(meta["n_expert_used"])
    except ValueError as e:
        raise TraceFormatError(f"bad header number: {e}") from None
    if sorted(layer_bytes) != list(range(n_layer)):
        raise TraceFormatError(f"expected one '# layer=i expert_bytes=' line for each of {n_layer} layers")
    has_dropped = version != "v1"
    want = COLUMNS if has_dropped else COLUMNS_V1
    if lines[hdr].split(",")[: len(want)] != want:
        raise TraceFormatError(f"column header is {lines[hdr]!r}, expected {','.join(want)}")
    header = TraceHeader(model=meta.get("model", ""), arch=meta.get("arch", ""), n_layer=n_layer,
                         n_expert=n_expert, k=k, expert_bytes=[layer_bytes[i][0] for i in range(n_layer)],
                         dense_bytes=[layer_bytes[i][1] for i in range(n_layer)])
    return header, hdr, has_dropped


def _rows(header: TraceHeader, lines: list[str], first_lineno: int, has_dropped: bool = False) -> list[Route]:
    out: list[Route] = []
    for n, row in enumerate(lines, start=first_lineno):
        if not row or row.startswith("#"):
            continue
        f = row.split(",")
        try:
            turn, phase, step, layer, slot, expert = (int(x) for x in f[:6])
            residency = int(f[7])
            dropped = int(f[9]) if has_dropped else 0
        except (ValueError, IndexError):
            raise TraceFormatError(f"line {n}: expected {len(COLUMNS)} numeric fields, got {row!r}") from None
        if not 0 <= layer < header.n_layer or not 0 <= expert < header.n_expert:
            raise TraceFormatError(f"line {n}: layer {layer} / expert {expert} outside the header's shape")
        if phase not in (PREFILL, DECODE):
            raise TraceFormatError(f"line {n}: phase {phase} is neither 0 (prefill) nor 1 (decode)")
        if dropped not in (0, 1):
            raise TraceFormatError(f"line {n}: dropped {dropped} is neither 0 nor 1")
        out.append(Route(turn, phase, step, layer, slot, expert, residency, n, dropped))
    if not out:
        raise TraceFormatError("no routing rows")
    return out


def parse_route_trace(lines: Iterable[str], name: str = "trace") -> RouteTraceFile:
    """Parse the text of a route trace (pure). Raises TraceFormatError on anything malformed."""
    lines = [ln.rstrip("\r\n") for ln in lines]
    header, hdr, has_dropped = _header(lines)
    return RouteTraceFile(name=name, header=header, rows=_rows(header, lines[hdr + 1:], hdr + 2, has_dropped),
                          has_dropped=has_dropped)


def read_route_trace(path: str | Path) -> RouteTraceFile:
    """Read a trace file; any problem is a one-line UserError naming the file."""
    p = Path(path)
    hint = f"give a {FORMAT} {' or '.join(READS)} CSV (bmoe --moe-stream --route-trace FILE writes one)"
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"route trace {p}: cannot read it ({e.__class__.__name__}: {e}); {hint}") from None
    try:
        return parse_route_trace(text.splitlines(), name=trace_name(p))
    except TraceFormatError as e:
        raise UserError(f"route trace {p}: {e}; {hint}") from None


def trace_name(path: Path) -> str:
    name = path.name
    for suffix in (".route.csv", ".csv"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name
