"""What the router hook's stages share and hand out: a bound expert tensor, the per-token counters, a recorded
routing decision, the hook's error, and the tap signature."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from harness.engine.io.vm import Reservation
from harness.engine.model.gguf_layout import ExpertTensor
from harness.errors import EngineFailed

# tap(layer, phase, decode_index, hidden float32 [n_tok, n_embd]): a layer's MoE input, at its first expert matmul
Tap = Callable[[int, int, int, np.ndarray], None]


@dataclass
class Bound:
    addr: int  # the model tensor's address
    et: ExpertTensor
    res: Reservation
    isolate: bool  # answer True on its ask (not the last expert matmul of its layer)
    lane_id: int = -1  # its id with the reader (reader.register) for submit_registered; -1: not registered


@dataclass
class TokenCounters:
    stall_ns: int = 0
    mgmt_ns: int = 0
    mgmt_cpu_ns: int = 0  # the compute thread's own CPU time in the same sections (mgmt_ns is wall)
    mgmt_hidden_ns: int = 0  # of mgmt_ns, the time spent while demand reads were in flight that the token then
    # waited for (still running when the section ended): off the token's critical path
    mgmt_bg_cpu_ns: int = 0  # CPU time of the decode evictions decided on the evictor's thread (not in mgmt_ns)
    io_ns: int = 0
    read_bytes: int = 0
    lookups: int = 0
    hits: int = 0
    prefetch_bytes: int = -1  # with a Prefetcher: its counts for the token (prefetch.PrefetchCounts)
    prefetch_used_bytes: int = -1
    prefetch_wasted_bytes: int = -1


@dataclass
class RouteEvent:
    phase: int
    layer: int
    ids: np.ndarray  # [n_tokens, k]
    residency: dict[int, int] = field(default_factory=dict)  # expert -> 0 miss / 1 hit
    weights: np.ndarray | None = None  # [n_tokens, k] the router's weights, before any drop
    dropped: np.ndarray | None = None  # [n_tokens, k] bool


def settle(c: TokenCounters, t0: int, c0: int) -> int:
    """Count a management section that began at perf_counter_ns() t0 and then thread_time_ns() c0; its end (ns).
    The CPU clock is read last at the start and first at the end: its interval lies inside the wall clock's, so
    mgmt_cpu_ns <= mgmt_ns on any machine. (Read the other way round, the CPU interval ran past the wall one by the
    bytecodes between the two end reads: little on a real core, enough under qemu-user for a token's CPU to come
    out 0.126 ms above its wall: bench-data/2026-12-03-arm-gates.)"""
    c1 = time.thread_time_ns()
    t1 = time.perf_counter_ns()
    c.mgmt_ns += t1 - t0
    c.mgmt_cpu_ns += c1 - c0
    return t1


HIDDEN_WAIT_NS = 50_000  # a wait this long means the reads were still running: the mgmt before it was hidden


class HookError(EngineFailed, RuntimeError):
    """The streaming hook failed (a read, a bind, an unexpected graph): exit 3."""
