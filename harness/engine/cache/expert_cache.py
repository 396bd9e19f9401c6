"""Expert cache accounting, shared by the engine and the offline replay (one implementation).

Semantics (the C++ original's, so hit rates compare):
- one lookup per unique expert per layer batch; a duplicate inside the batch only promotes;
- a miss costs that layer's expert bytes;
- eviction runs after the batch and never evicts an entry the batch itself touched;
- the budget is the sum of resident expert bytes;
- budget 0 means "no cache": every lookup misses and the previous batch is dropped at the next one.

The cache decides *what* is resident; the engine does the I/O (reads the misses, drops the evicted
pages). Policies decide only which entry to evict; they live in harness.engine.cache.policies.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from harness.engine.cache.policies import Key, Policy, make_policy, native


@dataclass(slots=True)
class BatchResult:
    layer: int
    hits: list[int] = field(default_factory=list)
    misses: list[int] = field(default_factory=list)
    evicted: list[Key] = field(default_factory=list)


_new_result = object.__new__  # a BatchResult without its __init__ call (the hot path sets every field)


@dataclass
class CacheStats:
    lookups: int = 0
    hits: int = 0
    misses: int = 0
    bytes_read: int = 0
    evictions: int = 0

    @property
    def hit_pct(self) -> float:
        return 100.0 * self.hits / self.lookups if self.lookups else 0.0


class _NoEviction(Policy):
    name = "none-needed"

    def bind(self, budget_bytes: int, expert_bytes: Sequence[int]) -> None:
        pass

    def on_hit(self, key: Key, now: int) -> None:
        pass

    def on_insert(self, key: Key, now: int) -> None:
        pass

    def on_promote(self, key: Key, now: int) -> None:
        pass

    def on_evict(self, key: Key) -> None:
        pass

    def victim(self, protected: set[Key]) -> Key | None:
        return None


class ExpertCache:
    """Byte-budgeted residency set of (layer, expert) entries with a pluggable eviction policy."""

    def __init__(self, budget_bytes: int, expert_bytes: Sequence[int], policy: Policy | str = "lru",
                 n_expert: int | None = None):
        if budget_bytes < 0:
            raise ValueError("budget_bytes must be >= 0")
        self.budget = int(budget_bytes)
        self.expert_bytes = list(expert_bytes)
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        # with room for every expert of the model nothing is ever evicted, so no policy decision is ever
        # asked for: skip its bookkeeping (exact, and it keeps the policy's CPU cost off a fully cached run)
        self.never_evicts = n_expert is not None and self.budget >= n_expert * sum(self.expert_bytes)
        if self.never_evicts:
            self.policy = _NoEviction()
        self.policy.bind(self.budget, self.expert_bytes)  # advisory: layer-aware policies size by it
        self.resident: set[Key] = set()
        self.resident_bytes = 0
        self.stats = CacheStats()
        self._clock = 0
        self._last_batch: list[Key] = []
        self._protected: set[Key] = set()
        c = native.helper()
        self._lookup = None if c is None else getattr(c, "lookup", None)  # lookup_batch's loop, compiled
        self._evict_loop = None if c is None else getattr(c, "evict", None)  # evict_over_budget's
        # the policy's on_batch, or None where it is the base class's no-op (not called then: the same)
        self._on_batch = None if getattr(type(self.policy), "on_batch", None) is Policy.on_batch \
            and "on_batch" not in vars(self.policy) else self.policy.on_batch

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def lookup_batch(self, layer: int, experts: Iterable[int], evict: bool = True) -> BatchResult:
        """Account one layer batch; returns which experts to read and which entries to drop. With
        evict=False the eviction is left to `evict_over_budget()`, which the caller must run before the
        next batch (the engine does it while the batch's reads are in flight): the same decisions, in
        the same order, only later in time."""
        policy, enabled = self.policy, self.budget > 0
        lookup = self._lookup
        if lookup is not None and enabled:  # the compiled loop, with as little Python around it as may be
            if self._on_batch is not None:
                self._on_batch(layer, self._clock)
            res = _new_result(BatchResult)
            res.layer, res.evicted = layer, []
            res.hits, res.misses, self._protected, self._clock = lookup(
                self.resident, layer, experts, policy.on_promote, policy.on_hit, policy.on_insert, self._clock, True)
            nh, nm, eb = len(res.hits), len(res.misses), self.expert_bytes[layer]
            self.resident_bytes += eb * nm
            stats = self.stats
            stats.lookups += nh + nm
            stats.hits += nh
            stats.misses += nm
            stats.bytes_read += eb * nm
            if evict:
                res.evicted = self.evict_over_budget()
            return res
        res = BatchResult(layer, [], [])
        if not self.enabled:
            # no cache: the previous batch is dropped now that its compute is done
            res.evicted = self._last_batch
            for k in res.evicted:
                self.resident.discard(k)
            self.resident_bytes = 0
            self._last_batch = []
        eb = self.expert_bytes[layer]
        resident = self.resident
        policy.on_batch(layer, self._clock)
        on_promote, on_hit, on_insert = policy.on_promote, policy.on_hit, policy.on_insert
        if lookup is not None:  # the same loop, compiled (no cache)
            res.hits, res.misses, batch_keys, clock = lookup(resident, layer, experts, on_promote, on_hit, on_insert,
                                                             self._clock, enabled)
            self.resident_bytes += eb * len(res.misses)
        else:
            clock, hits, misses = self._clock, res.hits, res.misses
            seen: set[int] = set()
            batch_keys: set[Key] = set()
            for e in experts:
                e = int(e)
                if e in seen:
                    # a duplicate only promotes (no lookup, no bytes): for LRU it becomes the most recent,
                    # so after a prefill batch the order is that of last use, as in the C++ original
                    if enabled:
                        on_promote((layer, e), clock)
                    continue
                seen.add(e)
                key = (layer, e)
                batch_keys.add(key)
                clock += 1
                if key in resident:
                    hits.append(e)
                    on_hit(key, clock)
                else:
                    misses.append(e)
                    resident.add(key)
                    self.resident_bytes += eb
                    if enabled:
                        on_insert(key, clock)
        self._clock = clock
        stats, nh, nm = self.stats, len(res.hits), len(res.misses)
        stats.lookups += nh + nm
        stats.hits += nh
        stats.misses += nm
        stats.bytes_read += eb * nm
        if not self.enabled:
            self._last_batch = sorted(batch_keys)
            return res
        self._protected = batch_keys
        if evict:
            res.evicted = self.evict_over_budget()
        return res

    def evict_over_budget(self) -> list[Key]:
        """Evict down to the budget, never an entry the last batch touched; the entries evicted."""
        if self.resident_bytes <= self.budget:
            return []
        out: list[Key] = []
        if self._evict_loop is not None:  # the same loop, compiled
            out, self.resident_bytes = self._evict_loop(self.resident, self._protected, self.policy.victim,
                                                        self.policy.on_evict, self.expert_bytes,
                                                        self.resident_bytes, self.budget)
            self.stats.evictions += len(out)
            return out
        victim_of, protected, evict = self.policy.victim, self._protected, self._evict
        while self.resident_bytes > self.budget:
            victim = victim_of(protected)
            if victim is None:
                break  # everything left was touched by the last batch
            evict(victim)
            out.append(victim)
        return out

    def preload(self, layer: int, experts: Iterable[int]) -> list[int]:
        """Mark experts resident without a lookup (the engine's --cache-preload reads them at once).
        Only while they fit the budget; returns the experts inserted."""
        eb = self.expert_bytes[layer]
        added = []
        for e in experts:
            key = (layer, int(e))
            if key in self.resident or not self.enabled or self.resident_bytes + eb > self.budget:
                continue
            self.resident.add(key)
            self.resident_bytes += eb
            self._clock += 1
            self.policy.on_insert(key, self._clock)
            added.append(int(e))
        return added

    def admit(self, layer: int, expert: int) -> tuple[bool, list[Key]]:
        """A speculative insert (prefetch), outside any batch: no lookup, hit or miss is counted. The entry
        is told to the policy as an insert (as `preload` does) and room is made at once with the policy's own
        victims, never an entry the last batch touched. When the policy picks the new entry itself (it values
        it least) it is taken out again, uncounted: (False, evicted). Else (True, evicted). A policy whose
        counts outlive residency (lfu, the aged family) remembers even a refused insert as a use."""
        key = (layer, int(expert))
        if not self.enabled or key in self.resident:
            return False, []
        self.resident.add(key)
        self.resident_bytes += self.expert_bytes[layer]
        self._clock += 1
        self.policy.on_insert(key, self._clock)
        out: list[Key] = []
        while self.resident_bytes > self.budget:
            victim = self.policy.victim(self._protected)
            if victim is None or victim == key:
                self.forget(key)
                return False, out
            self._evict(victim)
            out.append(victim)
        return True, out

    def forget(self, key: Key) -> None:
        """Take an entry out without counting an eviction (a speculative entry whose read never ran)."""
        self.resident.remove(key)
        self.resident_bytes -= self.expert_bytes[key[0]]
        self.policy.on_evict(key)

    def _evict(self, key: Key) -> None:
        self.resident.remove(key)
        self.resident_bytes -= self.expert_bytes[key[0]]
        self.stats.evictions += 1
        self.policy.on_evict(key)


def token_cycle_bytes(expert_bytes: Sequence[int], k: int) -> int:
    """T: the bytes one token routes through (sum over MoE layers of k x expert bytes)."""
    return int(sum(int(b) * int(k) for b in expert_bytes if b))


def budget_problem(budget_bytes: int, cycle_bytes: int) -> str | None:
    """The one rule behind the guard: a non-zero budget under one token cycle T makes recency
    policies hit 0% (sequential flooding: layers repeat in a fixed order, so every entry is
    evicted before its layer comes round again). Returns the reason, or None when fine."""
    if 0 < budget_bytes < cycle_bytes:
        mib = 1024 * 1024
        return (
            f"cache budget {budget_bytes / mib:.0f} MiB is below one token cycle T = "
            f"{cycle_bytes / mib:.0f} MiB (sum over layers of k x expert bytes); under T an LRU "
            f"cache hits 0% (sequential flooding): give at least {-(-cycle_bytes // mib)} MiB, "
            "0 for no cache, or --force-cache"
        )
    return None
