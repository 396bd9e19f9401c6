"""The cache budget of a streamed run: `--cache-mb 0|N|auto` resolved into bytes, and the token-cycle guard.

Pure: the model's numbers (`ExpertSizes`) and the memory readings (`MemReading`, taken by
`sysstats.memory_reading()` at load) come in as values, so every branch runs in a test without a model
or llama.cpp.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.engine.cache.expert_cache import budget_problem, token_cycle_bytes
from harness.engine.io.sysstats import MemReading
from harness.errors import UserError

MIB = 1048576
AUTO_HEADROOM_MIB = 256


@dataclass(frozen=True)
class BudgetAsk:
    """What the user asked of the cache: `--cache-mb` (None = auto), `--cache-ceil-mb`, `--cache-preload`,
    `--force-cache` (EngineConfig.budget_ask() builds it)."""

    cache_mb: int | None
    cache_ceil_mb: int | None = None
    cache_preload: bool = False
    force_cache: bool = False


@dataclass(frozen=True)
class ExpertSizes:
    """What the plan needs of a model layout."""

    per_layer: Sequence[int]  # bytes of one expert of each layer (0 for a layer without experts)
    total: int  # bytes of every expert of the model
    dense: int  # bytes of everything else (stays resident)

    @classmethod
    def of(cls, layout) -> ExpertSizes:  # a harness.engine.model.gguf_layout.ModelLayout
        return cls(layout.expert_bytes_per_layer(), layout.expert_total_bytes, layout.nonexpert_bytes)


@dataclass
class CachePlan:
    budget_bytes: int
    mode: str  # "off" | "fixed" | "auto"
    cycle_bytes: int
    note: str = ""


def plan_cache(cfg: BudgetAsk, sizes: ExpertSizes, k: int, mem: MemReading | None = None) -> CachePlan:
    """Resolve --cache-mb into bytes and apply the token-cycle guard (the rule: cache.budget_problem).
    `mem` is needed for --cache-mb auto only. Raises UserError with one line when the plan is refused."""
    cycle = token_cycle_bytes(sizes.per_layer, k)
    total = sizes.total
    if cfg.cache_mb == 0:
        return CachePlan(0, "off", cycle, "no expert cache: every routed expert is read every token")
    if cfg.cache_mb is None:
        if mem is None:
            raise ValueError("plan_cache: --cache-mb auto needs a memory reading")
        plan = _auto(cfg, sizes, cycle, mem)
        if plan.budget_bytes == 0:
            return plan
    else:
        plan = CachePlan(cfg.cache_mb * MIB, "fixed", cycle, f"fixed {cfg.cache_mb} MiB")
    if cfg.cache_preload and plan.budget_bytes < total:
        raise UserError(f"--cache-preload needs a budget of every expert, {-(-total // MIB)} MiB; "
                        f"the budget is {plan.budget_bytes // MIB} MiB ({plan.note})")
    problem = budget_problem(plan.budget_bytes, cycle)
    if problem and not cfg.force_cache:
        raise UserError(problem)
    if problem:
        plan.note += " (forced below the token cycle: expect ~0% hits)"
    return plan


def _auto(cfg: BudgetAsk, sizes: ExpertSizes, cycle: int, mem: MemReading) -> CachePlan:
    avail = mem.available_mib * MIB
    why = f"MemAvailable {mem.available_mib:.0f} MiB"
    if mem.cgroup_limit_bytes is not None:
        lim, anon = mem.cgroup_limit_bytes, mem.anon_mib * MIB
        if lim - anon < avail:
            avail, why = lim - anon, f"cgroup limit {lim / MIB:.0f} MiB less {anon / MIB:.0f} MiB anon"
    budget = int(avail - sizes.dense - AUTO_HEADROOM_MIB * MIB)
    parts = [f"auto: {why}, less dense weights {sizes.dense / MIB:.0f} MiB and {AUTO_HEADROOM_MIB} MiB headroom"]
    if cfg.cache_ceil_mb is not None and budget > cfg.cache_ceil_mb * MIB:
        budget = cfg.cache_ceil_mb * MIB
        parts.append(f"capped by --cache-ceil-mb {cfg.cache_ceil_mb}")
    if budget > sizes.total:
        budget = sizes.total
        parts.append(f"capped at all experts ({sizes.total / MIB:.0f} MiB)")
    budget = max(budget, 0)
    note = "; ".join(parts) + f" -> {budget / MIB:.0f} MiB"
    if budget == 0 or (budget < cycle and not cfg.force_cache):
        # too little memory for a useful cache: under one token cycle a recency cache hits ~0%, and a budget
        # squeezed into the last free memory is what drives a capped run into reclaim (the dense weights get
        # evicted). The cache never changes the output, so auto falls back to none, and says so.
        why_not = "no memory left for one" if budget == 0 else f"below one token cycle T = {cycle / MIB:.0f} MiB"
        return CachePlan(0, "auto", cycle, f"{note}: {why_not}, so no expert cache (auto falls back to "
                         "--cache-mb 0; the output is the same either way)")
    return CachePlan(budget, "auto", cycle, note)
