"""Drive the engine's ExpertCache (harness/engine/cache/expert_cache.py) with a trace's batches: one implementation of
the accounting and of every policy, shared with the engine. Pure: no I/O."""

from __future__ import annotations

from dataclasses import dataclass

from harness.engine import POLICIES, ExpertCache, Key, Policy
from harness.replay.trace import RouteTrace

MIB = 1024 * 1024


@dataclass(frozen=True)
class ReplayResult:
    trace: str
    policy: str
    budget_bytes: int
    lookups: int
    hits: int
    bytes_read: int
    decode_tokens: int
    decode_lookups: int
    decode_hits: int
    decode_bytes_read: int
    max_over_budget: int  # largest resident - budget seen after a batch (0 when always respected)

    @property
    def budget_mib(self) -> float:
        return self.budget_bytes / MIB

    @property
    def hit_pct(self) -> float:
        """Cumulative over prefill and decode lookups, as the engine reports it."""
        return 100.0 * self.hits / self.lookups if self.lookups else 0.0

    @property
    def decode_hit_pct(self) -> float:
        return 100.0 * self.decode_hits / self.decode_lookups if self.decode_lookups else 0.0

    @property
    def mib_per_token(self) -> float:
        """Expert bytes read by decode per decode token, as the engine's moe-stream line (which adds
        only its O_DIRECT page padding)."""
        return self.decode_bytes_read / MIB / self.decode_tokens if self.decode_tokens else 0.0


def lookup_sequence(trace: RouteTrace) -> list[Key]:
    """The (layer, expert) lookups in the order ExpertCache performs them: one per unique expert per
    batch, at its first appearance."""
    return [(b.layer, e) for b in trace.batches for e in b.unique]


def build_policy(name: str, trace: RouteTrace) -> Policy:
    """A fresh policy object; an offline one (belady) is given the trace's future up front."""
    if name not in POLICIES:
        raise KeyError(name)
    policy = POLICIES[name]()
    if policy.offline:
        policy.prepare_offline(lookup_sequence(trace))  # type: ignore[attr-defined]
    return policy


def replay(trace: RouteTrace, policy: str | Policy, budget_bytes: int) -> ReplayResult:
    pol = build_policy(policy, trace) if isinstance(policy, str) else policy
    cache = ExpertCache(budget_bytes, trace.expert_bytes, pol)
    d_lookups = d_hits = d_bytes = 0
    over = 0
    for b in trace.batches:
        res = cache.lookup_batch(b.layer, b.experts)
        if b.token >= 0:
            d_lookups += len(res.hits) + len(res.misses)
            d_hits += len(res.hits)
            d_bytes += len(res.misses) * trace.expert_bytes[b.layer]
        if budget_bytes > 0:
            over = max(over, cache.resident_bytes - budget_bytes)
    s = cache.stats
    return ReplayResult(
        trace=trace.name,
        policy=pol.name,
        budget_bytes=budget_bytes,
        lookups=s.lookups,
        hits=s.hits,
        bytes_read=s.bytes_read,
        decode_tokens=trace.decode_tokens,
        decode_lookups=d_lookups,
        decode_hits=d_hits,
        decode_bytes_read=d_bytes,
        max_over_budget=over,
    )
