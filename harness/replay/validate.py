"""Check a replay against what the engine recorded: the trace's own residency column (per lookup) and
the `moe-cache:` line of the run's log. Pure except `read_engine_log`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from harness.engine import ExpertCache
from harness.replay.simulate import MIB
from harness.replay.trace import RouteTrace

_HIT = re.compile(r"^moe-cache: ([0-9.]+)% hit", re.M)
_BUDGET = re.compile(r"(?:cache=|budget )(\d+) MiB")


@dataclass(frozen=True)
class EngineLog:
    hit_pct: float  # as printed (one decimal)
    budget_mib: int


def parse_engine_log(text: str) -> EngineLog | None:
    """The recorded hit % and cache budget of a bmoe (C++) run log, or None when absent."""
    hit = _HIT.search(text)
    budgets = _BUDGET.findall(text)
    if not hit or not budgets:
        return None
    return EngineLog(float(hit.group(1)), int(budgets[-1]))


def read_engine_log(trace_path: str | Path) -> EngineLog | None:
    """The `.log` next to `<name>.route.csv`, if there is one."""
    p = Path(trace_path)
    log = p.with_name(p.name.removesuffix(".route.csv").removesuffix(".csv") + ".log")
    return parse_engine_log(log.read_text(errors="replace")) if log.is_file() else None


def recorded_hit_pct(trace: RouteTrace) -> float:
    """The engine's hit % from the trace's residency column (1 = hit), over unique lookups."""
    hits = sum(r == 1 for b in trace.batches for r in b.recorded)
    return 100.0 * hits / trace.lookups if trace.lookups else 0.0


@dataclass(frozen=True)
class Agreement:
    lookups: int
    same: int  # lookups where LRU replay and the recorded residency agree on hit/miss
    replay_hit_pct: float
    recorded_hit_pct: float


def lru_agreement(trace: RouteTrace, budget_mib: int) -> Agreement:
    """Replay global LRU (the engine's policy in the recorded run) and compare lookup by lookup."""
    cache = ExpertCache(budget_mib * MIB, trace.expert_bytes, "lru")
    same = 0
    for b in trace.batches:
        hits = set(cache.lookup_batch(b.layer, b.experts).hits)
        same += sum((e in hits) == (r == 1) for e, r in zip(b.unique, b.recorded, strict=True))
    return Agreement(trace.lookups, same, cache.stats.hit_pct, recorded_hit_pct(trace))
