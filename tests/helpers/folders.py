"""Campaign folders for tests, built through harness.formats: the records (complete, as the runner writes them), a
bmoe_metrics v2 CSV with known answers, and a whole folder whose runs are committed as the runner commits them."""

from __future__ import annotations

from harness.campaigns import store
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
    ReadBandwidth,
    RunRecord,
    save_manifest,
)
from harness.formats.outcome import GateRecord, Outcome

# the metrics CSV columns csv_text writes
COLS = "step,steps,wall_ms,io_ms,compute_ms,read_bytes,cache_hit_pct,stall_ms,mgmt_ms,majflt,cpu_ms"


def plan(name: str = "t", cells: list[tuple[str, dict]] | None = None, **kw) -> PlanRecord:
    """cells: (label, varied) pairs, or (label, varied, device) in a compare fleet; the first is the base."""
    cells = cells if cells is not None else [("base", {})]
    fields = dict(
        name=name, description="", model=ModelSource(path="m.gguf", recipe=None, push_from=None),
        target=TargetSpec(kind="local", serial=None, mem_cap_mib=None, drop_caches=False, evict_model=True),
        engine=EngineSpec(kind="external", path="engine", push_from=None, args={}),
        prompt="hi", tokens=5, warmup_tokens=1, repeats=2, order="alternating", seed=3, cross=False,
        timeout_s=60.0, cooldown=Cooldown(cpu_temp_max_c=None, mem_available_min_mib=None, max_wait_s=60.0,
                                              poll_s=2.0),
        base_flags={"-t": 2},
        cells=[PlanCell(index=i, label=lab, flags={"-t": 2, **var}, varied=var, **({"device": dev[0]} if dev else {}))
               for i, (lab, var, *dev) in enumerate(cells)],
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


def csv_text(walls, *, preamble=None, read_mib=10.0, hit=50.0):
    lines = []
    if preamble is not None:
        lines += ["# bmoe_metrics v2"] + [f"# {k}={v}" for k, v in preamble.items()]
    lines.append(COLS)
    for i, w in enumerate(walls, 1):
        lines.append(f"{i},{len(walls)},{w},{w / 2},{w * 0.6},{int(read_mib * 2**20)},{hit},{w * 0.3},{w * 0.1},"
                     f"4,{w}")
    lines.append(f"# summary n_decode={len(walls)} decode_tok_s={1000 * len(walls) / sum(walls):.4f}")
    return "\n".join(lines) + "\n"


def make_folder(tmp_path, cells, runs, *, bandwidth=None, repeats=2, warmup=1, temps=None, devices=None):
    """cells: list of (label, varied); runs: list of (cell, round, csv text or None for a failure), or (cell,
    round, text, device label) in a campaign over several devices (`devices`: label -> description). Each run
    is committed as the runner does it (its files hashed into the manifest)."""
    folder = tmp_path / "2026-01-02-t"
    (folder / "runs").mkdir(parents=True)
    recs = []
    for pos, (cell, rnd, text, *device) in enumerate(runs):
        rid = f"r{rnd + 1:02d}-c{cell:02d}"
        tmp = store.tmp_run_dir(folder, rid)
        tmp.mkdir()
        kw = dict(start=f"2026-01-02T00:00:{pos:02d}.000Z", end=f"2026-01-02T00:00:{pos:02d}.500Z",
                  cpu_temp_c=temps[pos] if temps else 40.0)
        if text is None:
            o = outcome("failed", reason="engine exited 3: boom", **kw)
        else:
            rows = sum(1 for x in text.splitlines() if x.strip() and not x.startswith("#")) - 1
            o = outcome("ok", tokens=rows, **kw)
            (tmp / "metrics.csv").write_text(text)
        slot = RunRecord(run_id=rid, round=rnd, cell=cell, position=pos)
        recs.append(slot.finish(o, store.commit_run(folder, rid, o)))
        if device:
            recs[-1].device = device[0]
    m = manifest("t", status="complete", runs=recs, cells=cells, warmup_tokens=warmup, repeats=repeats)
    m.read_bandwidth = ReadBandwidth(**bandwidth) if bandwidth else None
    if devices:
        m.devices = devices
    save_manifest(folder, m)
    return folder


TWO = [("base", {}), ("--fast=on", {"--fast": True})]
