"""Read `route_trace v1` files (DESIGN.md section 5) into the layer batches the engine's cache sees.

Batching follows DESIGN.md section 4: llama.cpp evaluates each layer once for the whole prompt, so the
prefill (phase 0) rows of one turn are grouped by layer into one batch per layer (the union of every
prompt token's experts, in order of first appearance), in layer order; a decode (phase 1) batch is one
token's experts in one layer. Parsing is pure (`parse_trace` takes lines); `load_trace` does the I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from harness.engine.cache import token_cycle_bytes
from harness.errors import UserError

TRACE_VERSION = 1
COLUMNS = ["turn", "phase", "step", "layer", "slot", "expert", "weight", "residency", "expert_bytes"]
_KV = re.compile(r"(\w+)=(\S*)")


@dataclass(frozen=True)
class Batch:
    """One cache lookup batch: a layer and its experts in routing order, duplicates kept (a prefill
    batch repeats an expert once per prompt token routed to it; the cache looks each expert up once,
    at its first appearance, and a duplicate only promotes). `unique` is the experts in order of first
    appearance, `recorded` the engine's residency for each of those as written in the trace (0 miss,
    1 hit, 2 prefetched), `token` the decode token index (-1 for prefill)."""

    layer: int
    experts: tuple[int, ...]
    token: int
    unique: tuple[int, ...]
    recorded: tuple[int, ...]


@dataclass
class RouteTrace:
    name: str
    model: str
    arch: str
    n_layer: int
    n_expert: int
    k: int
    expert_bytes: list[int]
    batches: list[Batch] = field(default_factory=list)
    prefill_tokens: int = 0
    decode_tokens: int = 0

    @property
    def cycle_bytes(self) -> int:
        """T: bytes one token routes through."""
        return token_cycle_bytes(self.expert_bytes, self.k)

    @property
    def lookups(self) -> int:
        return sum(len(b.unique) for b in self.batches)

    @property
    def working_set_bytes(self) -> int:
        """Bytes of every distinct (layer, expert) the trace touches: above this nothing is evicted."""
        keys = {(b.layer, e) for b in self.batches for e in b.unique}
        return sum(self.expert_bytes[layer] for layer, _ in keys)


class TraceFormatError(ValueError):
    """A malformed trace; the loader turns it into a UserError naming the file."""


def _header(lines: list[str]) -> tuple[dict[str, str], dict[int, int], int]:
    meta: dict[str, str] = {}
    layer_bytes: dict[int, int] = {}
    if not lines or not lines[0].startswith("# route_trace"):
        raise TraceFormatError("first line is not '# route_trace v1'")
    version = lines[0].split()[-1]
    if version != f"v{TRACE_VERSION}":
        raise TraceFormatError(f"route_trace version {version!r} is not supported (this reader knows v1)")
    hdr = next((i for i, line in enumerate(lines) if not line.startswith("#")), None)
    if hdr is None:
        raise TraceFormatError("no column header after the comment lines")
    for line in lines[1:hdr]:
        kv = dict(_KV.findall(line))
        try:
            if "layer" in kv and "expert_bytes" in kv:
                layer_bytes[int(kv["layer"])] = int(kv["expert_bytes"])
            else:
                meta.update(kv)
        except ValueError:
            raise TraceFormatError(f"bad header line {line!r}") from None
    return meta, layer_bytes, hdr


def parse_trace(lines: Iterable[str], name: str = "trace") -> RouteTrace:
    """Parse the text of a route trace. Raises TraceFormatError on anything malformed."""
    lines = [ln.rstrip("\r\n") for ln in lines]
    meta, layer_bytes, hdr = _header(lines)
    for key in ("n_layer", "n_expert", "n_expert_used"):
        if key not in meta:
            raise TraceFormatError(f"header lacks {key}=")
    try:
        n_layer, n_expert, k = int(meta["n_layer"]), int(meta["n_expert"]), int(meta["n_expert_used"])
    except ValueError as e:
        raise TraceFormatError(f"bad header number: {e}") from None
    if sorted(layer_bytes) != list(range(n_layer)):
        raise TraceFormatError(f"expected one '# layer=i expert_bytes=' line for each of {n_layer} layers")
    cols = lines[hdr].split(",")
    if cols[: len(COLUMNS)] != COLUMNS:
        raise TraceFormatError(f"column header is {lines[hdr]!r}, expected {','.join(COLUMNS)}")
    trace = RouteTrace(
        name=name,
        model=meta.get("model", ""),
        arch=meta.get("arch", ""),
        n_layer=n_layer,
        n_expert=n_expert,
        k=k,
        expert_bytes=[layer_bytes[i] for i in range(n_layer)],
    )
    _batches(trace, lines[hdr + 1 :], hdr + 2)
    return trace


def _batches(trace: RouteTrace, rows: list[str], first_lineno: int) -> None:
    # prefill of the current turn: layer -> [(expert, residency)] in routing order
    prefill: dict[int, list[tuple[int, int]]] = {}
    prefill_steps: set[int] = set()
    cur_key: tuple[int, int, int] | None = None
    cur: list[tuple[int, int]] = []
    decode_steps: list[tuple[int, int]] = []
    pending_turn: int | None = None

    def flush_decode() -> None:
        nonlocal cur_key, cur
        if cur_key is not None:
            trace.batches.append(_mk(cur_key[2], cur, len(decode_steps) - 1))
        cur_key, cur = None, []

    def flush_prefill() -> None:
        nonlocal pending_turn
        if pending_turn is not None:
            for layer in sorted(prefill):
                trace.batches.append(_mk(layer, prefill[layer], -1))
            trace.prefill_tokens += len(prefill_steps)
            prefill.clear()
            prefill_steps.clear()
        pending_turn = None

    for n, row in enumerate(rows, start=first_lineno):
        if not row or row.startswith("#"):
            continue
        f = row.split(",")
        try:
            turn, phase, step, layer, _slot, expert = (int(x) for x in f[:6])
            residency = int(f[7])
        except (ValueError, IndexError):
            raise TraceFormatError(f"line {n}: expected {len(COLUMNS)} numeric fields, got {row!r}") from None
        if not 0 <= layer < trace.n_layer or not 0 <= expert < trace.n_expert:
            raise TraceFormatError(f"line {n}: layer {layer} / expert {expert} outside the header's shape")
        if phase == 0:
            flush_decode()
            if pending_turn is not None and turn != pending_turn:
                flush_prefill()
            pending_turn = turn
            prefill_steps.add(step)
            prefill.setdefault(layer, []).append((expert, residency))
        elif phase == 1:
            flush_prefill()
            key = (turn, step, layer)
            if key != cur_key:
                flush_decode()
                if not decode_steps or decode_steps[-1] != (turn, step):
                    decode_steps.append((turn, step))
                cur_key = key
            cur.append((expert, residency))
        else:
            raise TraceFormatError(f"line {n}: phase {phase} is neither 0 (prefill) nor 1 (decode)")
    flush_decode()
    flush_prefill()
    trace.decode_tokens = len(decode_steps)
    if not trace.batches:
        raise TraceFormatError("no routing rows")


def _mk(layer: int, routed: list[tuple[int, int]], token: int) -> Batch:
    first: dict[int, int] = {}
    for e, r in routed:
        first.setdefault(e, r)
    return Batch(layer, tuple(e for e, _ in routed), token, tuple(first), tuple(first.values()))


def load_trace(path: str | Path) -> RouteTrace:
    """Read a trace file; any problem is a one-line UserError naming the file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(
            f"route trace {p}: cannot read it ({e.__class__.__name__}: {e}); "
            "give a route_trace v1 CSV such as data/route-traces/qwen.route.csv"
        ) from None
    try:
        return parse_trace(text.splitlines(), name=trace_name(p))
    except TraceFormatError as e:
        raise UserError(f"route trace {p}: {e}; give a route_trace v1 CSV (DESIGN.md section 5)") from None


def trace_name(path: Path) -> str:
    name = path.name
    for suffix in (".route.csv", ".csv"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name
