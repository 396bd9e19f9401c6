"""A route trace as the layer batches the engine's cache sees (the file itself: harness.formats.route_trace).

llama.cpp evaluates each layer once for the whole prompt, so the prefill (phase 0) rows of one turn are
grouped by layer into one batch per layer (every prompt token's experts in routing order), in layer
order; a decode (phase 1) batch is one token's experts in one layer. `batches` is pure; `parse_trace`
takes lines and `load_trace` a file.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from harness.engine import token_cycle_bytes
from harness.formats.route_trace import (
    PREFILL,
    Route,
    RouteTraceFile,
    TraceFormatError,
    parse_route_trace,
    read_route_trace,
)

__all__ = ["Batch", "RouteTrace", "TraceFormatError", "batches", "load_trace", "parse_trace"]


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


def batches(f: RouteTraceFile) -> RouteTrace:
    h = f.header
    trace = RouteTrace(name=f.name, model=h.model, arch=h.arch, n_layer=h.n_layer, n_expert=h.n_expert,
                       k=h.k, expert_bytes=list(h.expert_bytes))
    _group(trace, [r for r in f.rows if not r.dropped])  # a dropped expert was never looked up
    return trace


def parse_trace(lines: Iterable[str], name: str = "trace") -> RouteTrace:
    """Parse the text of a route trace. Raises TraceFormatError on anything malformed."""
    return batches(parse_route_trace(lines, name))


def load_trace(path: str | Path) -> RouteTrace:
    """Read a trace file; any problem is a one-line UserError naming the file."""
    return batches(read_route_trace(path))


def _group(trace: RouteTrace, rows: list[Route]) -> None:
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

    for r in rows:
        if r.phase == PREFILL:
            flush_decode()
            if pending_turn is not None and r.turn != pending_turn:
                flush_prefill()
            pending_turn = r.turn
            prefill_steps.add(r.step)
            prefill.setdefault(r.layer, []).append((r.expert, r.residency))
        else:
            flush_prefill()
            key = (r.turn, r.step, r.layer)
            if key != cur_key:
                flush_decode()
                if not decode_steps or decode_steps[-1] != (r.turn, r.step):
                    decode_steps.append((r.turn, r.step))
                cur_key = key
            cur.append((r.expert, r.residency))
    flush_decode()
    flush_prefill()
    trace.decode_tokens = len(decode_steps)


def _mk(layer: int, routed: list[tuple[int, int]], token: int) -> Batch:
    first: dict[int, int] = {}
    for e, r in routed:
        first.setdefault(e, r)
    return Batch(layer, tuple(e for e, _ in routed), token, tuple(first), tuple(first.values()))
