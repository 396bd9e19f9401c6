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


def release_slack(every: int, k: int, expert_bytes: Sequence[int]) -> int:
    """The evicted pages the page releaser may hold before giving them back (harness.engine.io.release): its open
    batch of `every` layers' evictions, a decode layer's at most k experts of the largest layer (a prompt's bursts can
    hold more: CapFit). CapFit counts it beside the budget, and --recycle-pages' pool holds at most the two."""
    return every * k * max(expert_bytes, default=0)


@dataclass(frozen=True)
class CapFit:
    """Whether a fixed cache fits under the memory cgroup's limit (`problem`), from what is known at load.

    The runtime footprint beyond the dense weights and the budget: the process's anonymous memory measured at load
    less the dense weights' copies (the interpreter, llama.cpp's model, KV cache and context), llama.cpp's compute
    buffer (reserved at load, touched by the first decode), the evicted pages the releaser thread may not have given
    back yet (a decode batch: `every` layers of k experts) and, under a budget smaller than one layer's experts, the
    rest of that layer (a prompt's batch can route to all of them at once). Measured on the 1.1 GiB qwen3moe of
    campaigns/peer-cxx.yaml under a 448 MiB cap (dense 139 MiB, anon): 67 + 36 + 30 MiB, so 176 MiB is the largest
    cache: 160 and 176 ran 64 tokens; 190 was OOM-killed at 64 tokens, 200 at 24, 206 at 12. Not a bound: a prompt's
    evictions on a model whose layers compute fast can wait longer for the releaser (on the 100 MB model of
    tests/faults/test_engine_cap.py the peak held 50-60 MiB more than a decode's; there a budget under one layer's
    experts is refused by the last term, and one above it ran)."""

    limit: int  # the cgroup's memory limit, bytes
    dense: int  # the dense weights' anonymous copies (--dense-weights anon; in the page cache they are reclaimable)
    budget: int  # the cache budget asked for
    resident: int  # the process's anonymous memory at load, less the dense weights' copies
    compute: int  # llama.cpp's compute buffer
    release: int  # evicted pages not yet released (a decode batch)
    layer: int = 0  # every expert of the largest layer (what a prompt's batch may need resident at once)

    @property
    def runtime(self) -> int:
        return self.resident + self.compute + self.release + self.burst

    @property
    def burst(self) -> int:
        return max(self.layer - self.budget, 0)

    @property
    def need(self) -> int:
        return self.dense + self.budget + self.runtime

    @property
    def largest_budget(self) -> int:
        room = self.limit - self.dense - self.resident - self.compute - self.release
        return room if room >= self.layer else 0  # under one layer's experts the burst takes what the cache saves

    def problem(self, force: bool) -> str | None:
        """None when it fits; else the line: the refusal, or with --force-cache the warning."""
        if self.need <= self.limit:
            return None
        fits = self.largest_budget // MIB
        sums = (f"dense weights {self.dense / MIB:.0f} MiB (anonymous) + cache {self.budget / MIB:.0f} MiB + runtime "
                f"{self.runtime / MIB:.0f} MiB ({self.resident / MIB:.0f} resident at load, {self.compute / MIB:.0f} "
                f"compute buffer, {self.release / MIB:.0f} evicted pages awaiting release"
                f"{f', {self.burst / MIB:.0f} of a prompt layer beyond the cache' if self.burst else ''}) "
                f"= {self.need / MIB:.0f} MiB, over the memory cgroup's limit of {self.limit / MIB:.0f} MiB")
        what = f"--cache-mb {fits} is the largest that fits" if fits else "no cache fits (--cache-mb 0)"
        if force:
            return (f"bmoe: warning: --cache-mb {self.budget // MIB} will not fit: {sums}; the kernel's OOM killer "
                    f"may end the run ({what}); going on because of --force-cache")
        return (f"--cache-mb {self.budget // MIB} cannot fit: {sums}; {what} (or raise the limit; --force-cache "
                "runs it anyway)")
