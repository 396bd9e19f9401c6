"""Run a campaign: one fresh engine process per run, in the planned order, each gated on the cooldown
condition, its raw files committed the moment it ends, the manifest rewritten after every run.

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

from harness.campaigns import store
from harness.campaigns.gate import StateSampler, wait_for_gate
from harness.campaigns.progress import RunProgress
from harness.campaigns.provenance import campaign_provenance, model_mismatch, model_sha256
from harness.campaigns.questions import quality_record, take_replies, write_prompts_file
from harness.campaigns.schema import Campaign
from harness.campaigns.traces import take_traces, trace_outputs
from harness.campaigns.validate import Plan, engine_argv_tail, plan_campaign
from harness.errors import UserError
from harness.formats.campaign import EngineSpec
from harness.formats.devstate import STATE_FILE, DeviceSample, write_states
from harness.formats.files import copy_file, disk_full, is_disk_full
from harness.formats.manifest import (
    ENGINE_LOG,
    FORMAT,
    METRICS_FILE,
    VERSION,
    EngineDesc,
    HarnessDesc,
    Manifest,
    ModelDesc,
    PlanCell,
    PlanRecord,
    ReadBandwidth,
    RunRecord,
    SessionRecord,
    load_manifest,
    plan_hash,
    save_manifest,
)
from harness.formats.outcome import Eviction, GateRecord, Outcome
from harness.formats.progress import parse_progress
from harness.formats.replies import PROMPTS_FILE
from harness.stats import tok_s
from harness.targets.base import RunOutcome, Target

M = TypeVar("M", bound=BaseModel)


def _every_field(m: M) -> M:
    """A campaign sub-model with every field marked as set, so the manifest writes defaults out too (the
    plan record must name every knob, and its hash must not depend on which ones the file spelt out)."""
    return type(m).model_validate(m.model_dump())


def plan_record(plan: Plan) -> PlanRecord:
    """Everything that defines the runs (hashed: a resumed folder must have the same plan)."""
    c = plan.campaign
    return PlanRecord(
        name=c.name,
        description=c.description,
        model=_every_field(c.model), target=_every_field(c.target), engine=_every_field(c.engine),
        prompt=c.prompt, tokens=c.tokens, warmup_tokens=c.warmup_tokens, repeats=c.repeats,
        order=c.order, seed=c.seed, cross=c.cross, timeout_s=c.timeout_s,
        cooldown=_every_field(c.cooldown),
        base_flags=c.flags,
        cells=[PlanCell(index=x.index, label=x.label, flags=x.flags, varied=x.varied,
                        **({"engine": x.engine, "setting": x.setting} if x.engine else {})) for x in plan.cells],
        order_of_runs=[r.run_id for r in plan.runs],
        **({"overrides": list(c.overrides)} if c.overrides else {}),  # absent without any: old hashes hold
        **({"quality": quality_record(c.quality)} if c.quality else {}),  # questions and grader, before any reply
        **({"engines": {k: _every_field(e) for k, e in c.engines.items()}} if c.engines else {}),
        **({"traces": True} if c.traces else {}),  # absent without: old hashes hold
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

    def argv0(self, label: str) -> list[str]:
        return self.engines[label].argv0 if label else self.engine_argv0

    def versions(self) -> dict[str, str]:
        return {k: e.version for k, e in self.engines.items()} or {"": self.engine_version}


def resolve_inputs(plan: Plan, target: Target, console: Console) -> Resolved:
    c = plan.campaign
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
    elif c.target.kind == "local":
        model = target.stage(c.resolve_local(str(c.model.path)), "model")
        desc = ModelDesc(path=model, bytes=_size_all(Path(model)))
    else:
        model = str(c.model.path)
        desc = ModelDesc(path=model)
    engines = {label: _resolve_engine(c.engine_of(label), c, target) for label in c.engine_labels()}
    ref = engines[c.engine_labels()[0]]
    return Resolved(engine_argv0=ref.argv0, engine_version=ref.version, model_path=model, model_desc=desc,
                    engines=engines if c.engines else {})


def _resolve_engine(e: EngineSpec, c: Campaign, target: Target) -> EngineDesc:
    """One engine staged on the target: its argv0 there and its `--version`."""
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
        runs=[RunRecord(run_id=r.run_id, round=r.round, cell=r.cell, position=r.position, status="pending")
              for r in plan.runs],
        sessions=[],
        **({"engines": res.engines} if res.engines else {}),
    )


def _harness_version() -> str:
    from harness import __version__

    return __version__


@dataclass
class CampaignResult:
    folder: Path
    n_ok: int
    n_failed: int
    n_skipped: int  # finished in an earlier session


def run_campaign(path: Path | str, *, root: Path = Path("bench-data"), console: Console | None = None,
                 fresh: bool = False, retry_failed: bool = False, target: Target | None = None,
                 overrides: list[str] | tuple[str, ...] = ()) -> CampaignResult:
    """Run or resume a campaign. `overrides` (`--set KEY=VALUE`) are part of the plan: a folder resumes
    only with the same ones, in the same order."""
    console = console or Console(stderr=True)
    plan = plan_campaign(path, overrides=overrides)
    rec = plan_record(plan)
    h = plan_hash(rec)
    own_target = target is None
    target = target or make_target(plan)
    lock: store.FolderLock | None = None
    try:
        with store.campaign_lock(root, plan.campaign.name):  # choosing or creating the folder: one at a time
            stale = store.clear_stale_starts(root, plan.campaign.name)
            folder = None if fresh else store.find_resumable(root, plan.campaign.name, h,
                                                             with_failed=retry_failed)
            now = time.time()
            if folder is None:
                if not fresh:
                    _note_other_plans(root, plan, h, console)
                res = resolve_inputs(plan, target, console)
                m = new_manifest(plan, rec, target.describe(), res, now)
                m.provenance = campaign_provenance(plan, target, res, m.target.dump())
                if plan.campaign.target.kind == "local":
                    from harness.campaigns.probe import probe_read_bandwidth

                    m.read_bandwidth = ReadBandwidth(**probe_read_bandwidth(Path(res.model_path)))

                def fill(d: Path) -> None:
                    copy_file(plan.campaign.source, d / "campaign.yaml")
                    if plan.campaign.quality is not None:
                        write_prompts_file(d, plan.campaign.quality)
                    save_manifest(d, m)

                folder = store.new_folder(root, plan.campaign.name, now, fill)
                lock = store.lock_folder(folder)
                console.print(f"campaign {plan.campaign.name}: {len(plan.cells)} cells x {plan.campaign.repeats} "
                              f"repeats = {len(plan.runs)} runs -> {folder}"
                              f"{' (removed a half-made start: ' + ', '.join(stale) + ')' if stale else ''}")
            else:
                lock = store.lock_folder(folder)  # FolderBusy, naming the holder, when another runner has it
                m = load_manifest(folder)
                res = resolve_inputs(plan, target, console)
                was = {k: e.version for k, e in m.engines.items()} if m.engines else {"": m.engine.version}
                for k, ver in res.versions().items():
                    if was.get(k) != ver:
                        raise UserError(f"{folder}: the engine{' ' + k if k else ''} changed since this campaign "
                                        f"started ({was.get(k)!r} -> {ver!r}); runs from two builds do not "
                                        f"compare: finish it with the first one, or start over with --fresh")
                gone = store.clear_tmp(folder)
                adopted = store.adopt_orphans(folder, m)
                if retry_failed:
                    again = store.reset_failed(m)
                    console.print(f"retrying {len(again)} failed run(s): {' '.join(again)}")
                done = sum(r.finished for r in m.runs)
                console.print(f"campaign {plan.campaign.name}: resuming {folder} ({done}/{len(m.runs)} runs "
                              f"finished{', dropped partial ' + ', '.join(gone) if gone else ''}"
                              f"{', adopted ' + ', '.join(adopted) if adopted else ''})")
        m.status = "running"
        m.sessions.append(SessionRecord(start=store.iso(now), end=None, **git_commit(Path.cwd())))
        save_manifest(folder, m)
        return _run_all(plan, m, folder, target, res, console)
    finally:
        if lock is not None:
            lock.release()
        if own_target:
            target.close()


def _note_other_plans(root: Path, plan: Plan, h: str, console: Console) -> None:
    """Starting a new folder while one of this campaign with another plan is unfinished: say how to resume it."""
    for d, sets in store.unfinished_elsewhere(root, plan.campaign.name, h):
        how = " ".join(f"--set {shlex.quote(o)}" for o in sets) or "no --set"
        console.print(f"note: {d} is unfinished with a different plan (the file changed, or other --set "
                      f"arguments: it had {how}); starting a new folder")


def _run_all(plan: Plan, m: Manifest, folder: Path, target: Target, res: Resolved, console: Console
             ) -> CampaignResult:
    c = plan.campaign
    pending = [i for i, r in enumerate(m.runs) if not r.finished]
    skipped = len(m.runs) - len(pending)
    prog = RunProgress(console, total_runs=len(m.runs), done_runs=skipped, n_cells=len(plan.cells),
                       tokens=c.tokens)
    try:
        with prog:
            for i in pending:
                r = m.runs[i]
                cell = plan.cells[r.cell]
                prog.start_run(r.run_id, cell.label, r.round + 1, c.repeats, cell.index)
                outcome, hashes = _one_run(plan, r, folder, target, res, prog,
                                           m.provenance.model_sha256 if m.provenance else None)
                m.runs[i] = r.finish(outcome, hashes)
                save_manifest(folder, m)
                prog.end_run(r.run_id, cell.label, outcome.dump())
        m.status = "complete" if all(r.finished for r in m.runs) else "running"
    except BaseException as e:  # Ctrl-C, or an error in what we were given: drop the half-written run
        store.clear_tmp(folder)
        m.status = "interrupted" if isinstance(e, KeyboardInterrupt) else f"stopped: {type(e).__name__}: {e}"
        raise
    finally:
        m.sessions[-1].end = store.iso(time.time())
        save_manifest(folder, m)
    n_ok = sum(r.status == "ok" for r in m.runs)
    n_failed = sum(r.status == "failed" for r in m.runs)
    return CampaignResult(folder=folder, n_ok=n_ok, n_failed=n_failed, n_skipped=skipped)


def _one_run(plan: Plan, r: RunRecord, folder: Path, target: Target, res: Resolved,
             prog: RunProgress, want_model: dict[str, str] | None) -> tuple[Outcome, dict[str, str]]:
    """Run it, write its raw files, commit its folder: (its outcome, the sha256 of each of its files). A
    model file other than the campaign's (`want_model`, its sha256) fails the run without starting it."""
    c = plan.campaign
    cell = plan.cells[r.cell]
    tmp = store.tmp_run_dir(folder, r.run_id)
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        tmp.mkdir(parents=True)
    except OSError as e:
        if is_disk_full(e):
            raise disk_full(tmp, None) from None
        raise

    have_model = model_sha256(target, res.model_path)
    refuse = model_mismatch(want_model, have_model) if want_model is not None else None
    if refuse is not None:
        write_states(tmp / STATE_FILE, [])
        refused = _refused(refuse, store.iso(time.time()), have_model)
        return refused, store.commit_run(folder, r.run_id, refused)
    gate = wait_for_gate(target.sample_state, c.cooldown, on_wait=prog.waiting)
    evicted = None
    if c.target.kind == "local" and c.target.evict_model:
        from harness.campaigns.pagecache import evict_model_files

        evicted = evict_model_files(Path(res.model_path))
    remote_csv = f"{target.run_dir().rstrip('/')}/{r.run_id}.csv"
    outputs = [remote_csv]
    quality: dict[str, str] = {}
    if c.quality is not None:  # the folder's questions in, this run's replies out
        quality = {"prompts": target.stage(folder / PROMPTS_FILE, "prompts"),
                   "replies": f"{target.run_dir().rstrip('/')}/{r.run_id}.replies.jsonl"}
        outputs.append(quality["replies"])
    traces = trace_outputs(target.run_dir(), r.run_id) if c.traces else {}
    outputs += traces.values()
    # a quality run's tokens are in its CSV and its replies: no progress line per token in engine.log (a
    # hundred questions of hundreds of tokens would make it the folder's biggest file); its log has the text
    argv = res.argv0(cell.engine) + engine_argv_tail(c, cell, model=res.model_path, csv=remote_csv,
                                               progress=c.quality is None, **quality, **traces)

    def on_line(line: str) -> None:
        d = parse_progress(line)
        if d is not None:
            prog.token(d)

    t_start = time.time()
    with StateSampler(target.sample_state) as sampler:
        done: RunOutcome = target.run(argv, timeout_s=c.timeout_s, outputs=outputs, out_dir=tmp,
                                      log_path=tmp / ENGINE_LOG, on_stdout_line=on_line)
    t_end = time.time()

    reason = done.reason
    csv_local = done.fetched.get(remote_csv)
    n_tokens = None
    decode_tok_s = None
    if csv_local is not None:
        dest = tmp / METRICS_FILE
        if Path(csv_local) != dest:
            Path(csv_local).replace(dest)
        if reason is None:
            from harness.formats.metrics_csv import read_metrics

            try:
                mt = read_metrics(dest)
                bad = mt.problem(None)
                if bad is not None:
                    raise UserError(bad)
                n_tokens = len(mt.rows)
                decode_tok_s = round(tok_s(mt.wall_ms()), 4)
            except UserError as e:
                reason = f"engine exited 0 but its CSV is unreadable: {e}"
    elif reason is None:
        reason = "engine exited 0 but wrote no metrics CSV"
    if quality:
        reason = take_replies(done.fetched.get(quality["replies"]), tmp, len(c.quality.ids or [])
                              or int(c.quality.n or 0), reason)
    if reason is None:
        reason = take_traces(done.fetched, traces, tmp)
    write_states(tmp / STATE_FILE, sampler.samples)

    outcome = Outcome(
        status="ok" if reason is None and done.exit_code == 0 else "failed",
        reason=reason if reason is not None or done.exit_code == 0 else f"engine exited {done.exit_code}",
        start=store.iso(t_start), end=store.iso(t_end), wall_s=round(done.wall_s, 3),
        exit_code=done.exit_code, tokens=n_tokens, tok_s_all=decode_tok_s,
        peak_mem_mib=done.peak_mem_mib,
        oom_killed=done.oom_killed, argv=argv,
        model_evicted=Eviction(**evicted) if evicted is not None else None,
        gate=GateRecord(**gate.record()), entry_state=DeviceSample(**gate.entry),
        n_state_samples=len(sampler.samples), sampler_errors=sampler.errors, model_sha256=have_model,
    )
    return outcome, store.commit_run(folder, r.run_id, outcome)


def _refused(reason: str, t: str, model: dict[str, str]) -> Outcome:
    """The outcome of a run not started (every field given, as for any finished run)."""
    return Outcome(status="failed", reason=reason, start=t, end=t, wall_s=0.0, exit_code=None, tokens=None,
                   tok_s_all=None, peak_mem_mib=None, oom_killed=None, argv=None, model_evicted=None, gate=None,
                   entry_state=None, n_state_samples=0, sampler_errors=[], model_sha256=model)
