"""Run a campaign: one fresh engine process per run, in the planned order, each gated on the cooldown
condition, its raw files committed the moment it ends, the manifest rewritten as runs finish (store.ManifestSaver).

Resumable: `run_campaign` on the same file continues the newest unfinished folder with the same plan;
finished runs (ok or failed) are never repeated. A failed run is recorded with its reason and the rest
go on. Ctrl-C kills the engine (the target does), drops the half-written run and leaves the manifest as
it was after the last finished run. One runner per folder (store.FolderLock): a second one is refused,
naming the first's PID; a full disk stops the campaign with one line (formats.files.DiskFull), the
folder resumable."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel
from rich.console import Console

from harness.campaigns import folder_setup, store
from harness.campaigns.fidelity import fidelity_record
from harness.campaigns.precision import describe
from harness.campaigns.prepared import preparing
from harness.campaigns.provenance import campaign_provenance
from harness.campaigns.questions import quality_record
from harness.campaigns.rounds import CampaignResult as CampaignResult  # re-exported: run_campaign returns it
from harness.campaigns.rounds import run_all
from harness.campaigns.schema import Campaign
from harness.campaigns.shard import Shard, rounds_text, shard_plan
from harness.campaigns.validate import Plan, plan_campaign
from harness.devices.timeouts import campaign_limits
from harness.errors import UserError
from harness.formats.campaign import COOLDOWN_LATER, Cooldown, EngineSpec
from harness.formats.campaign_replicate import tries_text, try_of
from harness.formats.hub_source import HubSource
from harness.formats.manifest import (
    FORMAT,
    VERSION,
    EngineDesc,
    HarnessDesc,
    Manifest,
    ModelDesc,
    PlanCell,
    PlanRecord,
    ReadBandwidth,
    RunRecord,
    hashes_removed,
    load_manifest,
    plan_hash,
    removed_message,
    unhashed_runs,
)
from harness.targets.base import Target

M = TypeVar("M", bound=BaseModel)


def _every_field(m: M) -> M:
    """A campaign sub-model with every field marked as set, so the manifest writes defaults out too (the
    plan record must name every knob, and its hash must not depend on which ones the file spelt out)."""
    return type(m).model_validate(m.model_dump())


def _cooldown(cd: Cooldown) -> Cooldown:
    """Every field set but those added later (COOLDOWN_LATER), set only when not their default: an older folder's
    plan hashes the same and resumes."""
    d = cd.model_dump()
    for k in COOLDOWN_LATER:
        if d[k] == Cooldown.model_fields[k].default:
            del d[k]
    return Cooldown.model_validate(d)


def plan_record(plan: Plan) -> PlanRecord:
    """Everything that defines the runs (hashed: a resumed folder must have the same plan)."""
    c = plan.campaign
    return PlanRecord(
        name=c.name,
        description=c.description,
        model=_every_field(c.model), target=_every_field(c.target), engine=_every_field(c.engine),
        prompt=c.prompt, tokens=c.tokens, warmup_tokens=c.warmup_tokens, repeats=c.min_repeats(),
        order=c.order, seed=c.seed, cross=c.cross, timeout_s=c.timeout_s,
        cooldown=_cooldown(c.cooldown),
        base_flags=c.flags,
        cells=[PlanCell(index=x.index, label=x.label, flags=x.flags, varied=x.varied,
                        **({"engine": x.engine, "setting": x.setting} if x.engine else {}),
                        **({"device": x.device} if x.device else {})) for x in plan.cells],
        order_of_runs=[r.run_id for r in plan.runs],
        **({"overrides": list(c.overrides)} if c.overrides else {}),  # absent without any: old hashes hold
        **({"quality": quality_record(c.quality)} if c.quality else {}),  # questions and grader, before any reply
        **({"engines": {k: _every_field(e) for k, e in c.engines.items()}} if c.engines else {}),
        **({"traces": True} if c.traces else {}),  # absent without: old hashes hold
        **({"precision": c.precision.model_copy(update={"min_repeats": c.min_repeats()})} if c.precision else {}),
        **({"fidelity": fidelity_record(c, plan.cells)} if c.fidelity else {}),  # absent without: old hashes hold
        **({"family": c.family} if c.family else {}),  # absent without: old hashes hold
        **({"fleet": plan.fleet} if plan.fleet is not None else {}),  # likewise
        **({"sample_text": c.sample_text} if c.sample_text else {}),  # likewise
        **({"prepare": _every_field(c.prepare)} if c.prepare is not None else {}),  # likewise
        **({"replicate": c.replicate} if c.replicate else {}),  # likewise
    )


def reproduce_command(plan: Plan) -> str:
    """The command that runs this plan again: the campaign file and its `--set` arguments."""
    c = plan.campaign
    return f"bmoe-bench run {c.source}" + "".join(f" --set {shlex.quote(o)}" for o in c.overrides)


def git_commit(cwd: Path) -> dict:
    def git(*args: str) -> str | None:
        try:
            p = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return p.stdout.strip() if p.returncode == 0 else None

    head = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": head, "dirty": bool(dirty) if dirty is not None else None}


def make_target(plan: Plan) -> Target:
    t = plan.campaign.target
    if t.kind == "local":
        from harness.targets.local import LocalTarget

        return LocalTarget(mem_cap_mib=t.mem_cap_mib, drop_caches=t.drop_caches)
    if t.kind in ("ssh", "termux"):
        from harness.targets.ssh import ssh_target

        return ssh_target(t)
    from harness.targets.adb import AdbTarget  # imported only for adb campaigns (adbutils)

    return AdbTarget(serial=t.serial)


def bmoe_executable() -> str:
    cand = Path(sys.executable).parent / "bmoe"
    if cand.is_file():
        return str(cand)
    found = shutil.which("bmoe")
    if found is None:
        raise UserError("engine bmoe: the `bmoe` command is not installed here; pip install -e . in this "
                        "environment, or use engine: {kind: external, path: ...}")
    return found


@dataclass
class Resolved:
    engine_argv0: list[str]
    engine_version: str
    model_path: str  # on the target
    model_desc: ModelDesc = field(default_factory=ModelDesc)
    engines: dict[str, EngineDesc] = field(default_factory=dict)  # engines axis: label -> argv0, version
    hub: HubSource | None = None  # model: {hf: ...}: what the pull resolved

    def argv0(self, label: str) -> list[str]:
        return self.engines[label].argv0 if label else self.engine_argv0

    def versions(self) -> dict[str, str]:
        return {k: e.version for k, e in self.engines.items()} or {"": self.engine_version}


def resolve_inputs(plan: Plan, target: Target, console: Console) -> Resolved:
    c = plan.campaign
    hub = None
    # model
    if c.model.recipe is not None:
        from harness.campaigns.recipe import ensure_model, recipe_spec

        spec = recipe_spec(c.model.recipe)
        console.print(f"model: generating (or reusing) the recipe's model {c.model.recipe}")
        local = ensure_model(spec, progress=console.is_terminal)
        model = target.stage(local, "model")
        desc = ModelDesc(recipe=c.model.recipe, file=str(local), bytes=_size_all(local))
    elif c.model.push_from is not None:
        model = target.stage(c.resolve_local(c.model.push_from), "model")
        desc = ModelDesc(path=model, pushed_from=c.model.push_from)
    elif c.model.hf is not None:
        from harness.campaigns.hub import pull_model

        model, desc, hub = pull_model(c.model.hf, target, console)
    elif c.target.kind == "local":
        model = target.stage(c.resolve_local(str(c.model.path)), "model")
        desc = ModelDesc(path=model, bytes=_size_all(Path(model)))
    else:
        model = str(c.model.path)
        desc = ModelDesc(path=model)
    engines = {label: _resolve_engine(c.engine_of(label), c, target) for label in c.engine_labels()}
    ref = engines[c.engine_labels()[0]]
    return Resolved(engine_argv0=ref.argv0, engine_version=ref.version, model_path=model, model_desc=desc,
                    engines=engines if c.engines else {}, hub=hub)


def _resolve_engine(e: EngineSpec, c: Campaign, target: Target) -> EngineDesc:
    """One engine staged on the target: its argv0 there and its `--version`."""
    if e.kind == "bmoe" and hasattr(target, "bmoe_argv0"):  # ssh, termux: the deployed venv, at our version
        argv0 = target.bmoe_argv0(fix=f"bmoe-bench deploy {c.source}")
        return EngineDesc(kind=e.kind, argv0=argv0, version=_version_target(target, argv0))
    if e.kind == "bmoe":
        argv0 = [bmoe_executable()]
        return EngineDesc(kind=e.kind, argv0=argv0, version=_version_local(argv0))
    if e.push_from is not None:
        exe = target.stage(c.resolve_local(e.push_from), "engine")
    elif c.target.kind == "local":
        exe = target.stage(c.resolve_local(str(e.path)), "engine")
    else:
        exe = str(e.path)
    version = _version_local([exe]) if c.target.kind == "local" else _version_target(target, [exe])
    return EngineDesc(kind=e.kind, argv0=[exe], version=version)


def _size_all(p: Path) -> int | None:
    try:
        return p.stat().st_size
    except OSError:
        return None


def _version_local(argv0: list[str]) -> str:
    try:
        p = subprocess.run([*argv0, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({type(e).__name__})"
    out = (p.stdout.strip() or p.stderr.strip()).splitlines()
    return out[0] if p.returncode == 0 and out else f"unknown (--version exited {p.returncode})"


def _version_target(target: Target, argv0: list[str]) -> str:
    """`ENGINE --version` run on the target: its first output line, or why not."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix=f"bmoe-version-{os.getpid()}-") as d:
        log = Path(d) / "version.log"
        out = target.run([*argv0, "--version"], timeout_s=60, outputs=[], out_dir=Path(d), log_path=log)
        lines = [x.strip() for x in log.read_text(errors="replace").splitlines() if x.strip()] \
            if log.is_file() else []
    if out.ok and lines:
        return lines[0]
    return f"unknown ({out.reason or 'no output'} for --version)"


def new_manifest(plan: Plan, rec: PlanRecord, target_desc: dict, res: Resolved, t: float) -> Manifest:
    return Manifest(
        format=FORMAT,
        version=VERSION,
        created=store.iso(t),
        status="running",
        campaign=rec,
        plan_hash=plan_hash(rec),
        source=plan.campaign.source,
        reproduce=reproduce_command(plan),
        harness=HarnessDesc(bmoe_bench=_harness_version(), **git_commit(Path.cwd())),
        engine=EngineDesc(kind=plan.campaign.engine_of(plan.campaign.engine_labels()[0]).kind,
                          argv0=res.engine_argv0, version=res.engine_version),
        model=res.model_desc,
        target=target_desc,
        read_bandwidth=None,
        runs=[RunRecord(run_id=r.run_id, round=r.round, cell=r.cell, position=r.position, status="pending",
                        **({"try_index": t} if (t := try_of(r.round, rec.repeats, rec.replicate)) is not None else {}))
              for r in plan.runs],
        sessions=[],
        **({"engines": res.engines} if res.engines else {}),
    )


def _harness_version() -> str:
    from harness import __version__

    return __version__


def run_campaign(path: Path | str, *, root: Path = Path("bench-data"), console: Console | None = None,
                 fresh: bool = False, retry_failed: bool = False, target: Target | None = None,
                 overrides: list[str] | tuple[str, ...] = (), fleet_target=None, shard: Shard | None = None
                 ) -> CampaignResult:
    """Run or resume a campaign. `overrides` (`--set KEY=VALUE`) are part of the plan: a folder resumes
    only with the same ones, in the same order. A fleet campaign (`targets:` or `fleet:`) goes to
    harness.campaigns.fleet.run, its devices made by `fleet_target(FleetDevice)` (default: AdbTarget). `shard`: only
    that shard's rounds (harness.campaigns.shard), in a folder of its own that has the whole plan's record and hash
    and resumes only as that shard."""
    console = console or Console(stderr=True)
    plan = plan_campaign(path, overrides=overrides)
    with campaign_limits(plan.campaign.device_timeout_s):
        return _run_plan(plan, root, console, fresh, retry_failed, target, fleet_target, shard)


def _run_plan(plan: Plan, root: Path, console: Console, fresh: bool, retry_failed: bool, target: Target | None,
              fleet_target, shard: Shard | None) -> CampaignResult:
    if plan.campaign.targets is not None or plan.campaign.fleet is not None:
        from harness.campaigns.fleet.run import Kit, run_fleet_campaign

        kit = Kit(plan_record, new_manifest, resolve_inputs, _note_other_plans, _refuse_unhashed, git_commit)
        return run_fleet_campaign(plan, kit, root=root, console=console, fresh=fresh, retry_failed=retry_failed,
                                  **({"make_target": fleet_target} if fleet_target is not None else {}), shard=shard)
    rec = plan_record(plan)
    h = plan_hash(rec)
    plan = shard_plan(plan, shard)  # its share of the runs; the record and the hash stay the whole plan's
    own_target = target is None
    target = target or make_target(plan)
    lock: store.FolderLock | None = None
    try:
        with store.campaign_lock(root, plan.campaign.name):  # choosing or creating the folder: one at a time
            stale = store.clear_stale_starts(root, plan.campaign.name)
            folder = None if fresh else store.find_resumable(root, plan.campaign.name, h, with_failed=retry_failed,
                                                             shard=str(shard) if shard else None)
            now = time.time()
            if folder is None:
                if not fresh:
                    _note_other_plans(root, plan, h, console)
                res = resolve_inputs(plan, target, console)
                m = new_manifest(plan, rec, target.describe(), res, now)
                if shard is not None:
                    m.shard = str(shard)
                m.provenance = campaign_provenance(plan, target, res, m.target.dump())
                if plan.campaign.target.kind == "local":
                    from harness.campaigns.probe import lanes_of, probe_read_bandwidth

                    m.read_bandwidth = ReadBandwidth(**probe_read_bandwidth(Path(res.model_path),
                                                                            lanes=lanes_of(plan.cells)))

                folder = folder_setup.create(root, plan, m, now)
                lock = store.lock_folder(folder)
                more = f" (then whole rounds until {describe(rec.precision)})" if rec.precision else ""
                if rec.replicate is not None:
                    more += f" ({tries_text(rec.replicate)})"
                if shard is not None:
                    more += f", shard {shard}: {rounds_text(plan)}, {len(plan.runs)} runs"
                console.print(f"campaign {plan.campaign.name}: {len(plan.cells)} cells x {rec.repeats} "
                              f"repeats = {len(rec.order_of_runs)} runs{more} -> {folder}"
                              f"{' (removed a half-made start: ' + ', '.join(stale) + ')' if stale else ''}")
            else:
                lock = store.lock_folder(folder)  # FolderBusy, naming the holder, when another runner has it
                m = load_manifest(folder)
                _refuse_unhashed(folder, m)
                res = resolve_inputs(plan, target, console)
                was = {k: e.version for k, e in m.engines.items()} if m.engines else {"": m.engine.version}
                for k, ver in res.versions().items():
                    if was.get(k) != ver:
                        raise UserError(f"{folder}: the engine{' ' + k if k else ''} changed since this campaign "
                                        f"started ({was.get(k)!r} -> {ver!r}); runs from two builds do not "
                                        f"compare: finish it with the first one, or start over with --fresh")
                folder_setup.reopen(folder, m, plan.campaign.name, retry_failed, console)
        folder_setup.start_session(folder, m, now, git_commit(Path.cwd()))
        with preparing(folder, plan.campaign.prepare, console) as prep:  # restored however the runs end
            if prep is not None:
                prep.ensure(target)
            return run_all(plan, m, folder, target, res, console)
    finally:
        if lock is not None:
            lock.release()
        if own_target:
            target.close()


def _refuse_unhashed(folder: Path, m: Manifest) -> None:
    """A folder whose finished runs lack their file hashes is not resumed (saved again at the current version,
    they would look removed): removed entries are restored, a v1 folder migrated first."""
    un = unhashed_runs(m)
    if hashes_removed(m):
        raise UserError(f"{folder}: {removed_message(un)}")
    if un:
        raise UserError(f"{folder}: run(s) {' '.join(un)} are from before file hashes (manifest v1): record them "
                        f"first (`bmoe-bench report {shlex.quote(str(folder))} --migrate`), then resume")


def _note_other_plans(root: Path, plan: Plan, h: str, console: Console) -> None:
    """Starting a new folder while one of this campaign with another plan is unfinished: say how to resume it."""
    for d, sets in store.unfinished_elsewhere(root, plan.campaign.name, h):
        how = " ".join(f"--set {shlex.quote(o)}" for o in sets) or "no --set"
        console.print(f"note: {d} is unfinished with a different plan (the file changed, or other --set "
                      f"arguments: it had {how}); starting a new folder")
