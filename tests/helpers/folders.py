"""Campaign-folder records for tests, built through harness.formats (complete, as the runner writes them)."""

from __future__ import annotations

from harness.formats.campaign import Cooldown, EngineSpec, ModelSource, TargetSpec
from harness.formats.devstate import DeviceSample
from harness.formats.manifest import (
    FORMAT,
    VERSION,
    EngineDesc,
    HarnessDesc,
    LocalTargetDesc,
    Manifest,
    ModelDesc,
    PlanCell,
    PlanRecord,
    RunRecord,
)
from harness.formats.outcome import GateRecord, Outcome


def plan(name: str = "t", cells: list[tuple[str, dict]] | None = None, **kw) -> PlanRecord:
    """cells: (label, varied) pairs; the first is the base."""
    cells = cells if cells is not None else [("base", {})]
    fields = dict(
        name=name, description="", model=ModelSource(path="m.gguf", recipe=None, push_from=None),
        target=TargetSpec(kind="local", serial=None, mem_cap_mib=None, drop_caches=False, evict_model=True),
        engine=EngineSpec(kind="external", path="engine", push_from=None, args={}),
        prompt="hi", tokens=5, warmup_tokens=1, repeats=2, order="alternating", seed=3, cross=False,
        timeout_s=60.0, cooldown=Cooldown(cpu_temp_max_c=None, mem_available_min_mib=None, max_wait_s=60.0,
                                              poll_s=2.0),
        base_flags={"-t": 2},
        cells=[PlanCell(index=i, label=lab, flags={"-t": 2, **var}, varied=var) for i, (lab, var) in enumerate(cells)],
        order_of_runs=[],
    )
    return PlanRecord(**{**fields, **kw})


def outcome(status: str = "ok", start: str = "2026-01-02T00:00:00.000Z", *, reason: str | None = None,
            cpu_temp_c: float | None = 40.0, **kw) -> Outcome:
    fields = dict(
        status=status, reason=reason, start=start, end=start, wall_s=0.5, exit_code=0 if status == "ok" else 3,
        tokens=5, tok_s_all=10.0, peak_mem_mib=None, oom_killed=False, argv=["engine"], model_evicted=None,
        gate=GateRecord(waited_s=0.0, gave_up=False, reason=None, unchecked=[]),
        entry_state=DeviceSample(cpu_temp_c=cpu_temp_c, mem_available_mib=9000.0,
                                 cpufreq={"policy0": {"scaling_max_khz": 2000, "cpuinfo_max_khz": 2000}}),
        n_state_samples=0, sampler_errors=[],
    )
    return Outcome(**{**fields, **kw})


def manifest(name: str = "t", plan_hash: str = "h1", status: str = "running", *, runs: list[RunRecord] | None = None,
             **plan_kw) -> Manifest:
    return Manifest(
        format=FORMAT, version=VERSION, created="2026-01-02T00:00:00.000Z", status=status,
        campaign=plan(name, **plan_kw), plan_hash=plan_hash, source=f"campaigns/{name}.yaml",
        reproduce=f"bmoe-bench run campaigns/{name}.yaml",
        harness=HarnessDesc(bmoe_bench="0.1.0", commit="abc", dirty=False),
        engine=EngineDesc(kind="external", argv0=["engine"], version="x"), model=ModelDesc(path="m.gguf"),
        target=LocalTargetDesc(kind="local", cpus=2, mem_total_mib=2048.0), read_bandwidth=None,
        runs=runs or [], sessions=[],
    )
