"""`bmoe-bench merge A B C --out D`: the folders of one plan's shards (harness.campaigns.shard), run on several
machines, joined into one campaign folder, as an unsharded run of the same runs would have left it.

Checked before anything is written, every problem one line: each folder is a campaign folder (read as any
other, links out refused); every folder has the first one's plan (its matrix: a fleet's devices, an adb
serial and the --set spelling aside, so that each lab's fleet can run its shard; a folder of another plan is
refused); the engine builds and model files are the same (provenance); no shard and no finished run is in two folders;
every finished run has its files' sha256 in its manifest. Then each finished run's folder is copied into D and
hashed there: a file that differs from its manifest's sha256 (changed since committed, or a bad copy) refuses
the merge and D is removed. Nothing is written outside D: the shards' folders are only read (no lock is taken
in them), and D must be new or empty. Its manifest is written last (a folder without one is never a
campaign's).

The merged manifest is the first shard's (its target, harness and model records), with every folder's runs
in the plan's order, every session, no `shard`; a planned run no folder has finished is pending, so running
the campaign file with --out D's parent folder finishes it. Runs from machines that describe themselves
differently (another host, another device) keep their machine: `runs[].device` and `devices` (its
description), as a fleet records it; runs on one and the same machine carry none, as an unsharded run's."""

from __future__ import annotations

import errno
import hashlib
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import BmoeError, UserError
from harness.formats.files import disk_full, is_disk_full, sha256_file
from harness.formats.folder import CAMPAIGN_FILE, PROMPTS_FILE, RUNS
from harness.formats.manifest import DeviceProvenance, Manifest, RunRecord, load_manifest, run_dir, save_manifest
from harness.formats.raw_hashes import Budget, changed

_ID = re.compile(r"r([0-9]+)-c([0-9]+)")
_VOLATILE = ("device_dir_free_mib",)  # what a machine's description says that is not what the machine is


class MergeError(UserError):
    """Problems that refuse a merge: str() is the first one; `.lines` holds every one."""

    def __init__(self, lines: list[str]):
        self.lines = lines
        super().__init__(lines[0] + (f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""))


@dataclass
class MergeResult:
    folder: Path
    n_finished: int  # finished runs merged
    shards: list[str]  # the shards merged ("k/n"; "all" for an unsharded folder)
    pending: list[str] = field(default_factory=list)  # planned runs no folder has finished
    devices: list[str] = field(default_factory=list)  # machine labels, when the runs ran on several


def merge_folders(folders: list[Path], out: Path) -> MergeResult:
    folders = [Path(f) for f in folders]
    out = Path(out)
    problems: list[str] = []
    loaded: list[tuple[Path, Manifest]] = []
    for f in folders:
        try:
            loaded.append((f, load_manifest(f)))
        except UserError as e:
            problems.append(str(e))
    problems += _place_problems(folders, out)
    if not loaded:
        raise MergeError(problems or ["merge: name the shards' folders"])
    loaded.sort(key=lambda fm: _shard_index(fm[1]))
    problems += _plan_problems(loaded) + _run_problems(loaded)
    labels, devices, device_problems = _machines(loaded)
    problems += device_problems
    if not problems:
        problems += _verify_runs(loaded)  # before anything is copied: a crafted shard costs bounded reading only
    if problems:
        raise MergeError(problems)
    made = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a read-only or full destination: one line naming it
        raise _unwritable(out, e) from None
    try:
        bad = _copy_runs(loaded, out)
        if bad:
            raise MergeError(bad)
        m = _merged(loaded, labels, devices)
        save_manifest(out, m)
    except BaseException as e:
        _undo(out, made)
        if isinstance(e, OSError):
            raise _unwritable(out, e) from None
        raise
    pending = [r.run_id for r in m.runs if not r.finished]
    return MergeResult(folder=out, n_finished=len(m.runs) - len(pending), pending=pending,
                       shards=[fm[1].shard or "all" for fm in loaded], devices=sorted(devices))


def _unwritable(out: Path, e: OSError) -> BmoeError:
    """--out cannot be written (permissions, a read-only filesystem, a full disk, a name too long)."""
    if isinstance(e, shutil.Error) and e.args and isinstance(e.args[0], list) and e.args[0]:
        _src, dst, why = e.args[0][0]  # copytree gathers its failures as text
        full = f"[Errno {errno.ENOSPC}]" in str(why) or f"[Errno {errno.EDQUOT}]" in str(why)
        e = OSError(errno.ENOSPC if full else errno.EIO, str(why).split("] ")[-1].split(":")[0], dst)
    if is_disk_full(e):
        return disk_full(out, None, "free some space there, or merge into another --out")
    return UserError(f"--out {out}: cannot write {e.filename or 'there'} ({e.strerror or e}); give a --out "
                     "folder you can write")


def _shard_index(m: Manifest) -> int:
    return int(m.shard.split("/")[0]) if m.shard else 0


def _inside(a: Path, b: Path) -> bool:
    """a is b or inside it."""
    a, b = a.resolve(), b.resolve()
    return a == b or b in a.parents


def _place_problems(folders: list[Path], out: Path) -> list[str]:
    out_problems = []
    if out.exists() and (not out.is_dir() or out.is_symlink() or any(out.iterdir())):
        out_problems.append(f"{out}: already exists and is not an empty folder; --out names a new folder for the "
                            f"merged campaign")
    seen: dict[Path, Path] = {}
    for f in folders:
        if f.exists() and (_inside(out, f) or _inside(f, out)):
            out_problems.append(f"{out}: is {f} or inside it (or holds it); --out names a folder apart from the "
                                f"shards' folders, which are only read")
        key = f.resolve()
        if key in seen:
            out_problems.append(f"{f}: named twice (also as {seen[key]}); name each shard's folder once")
        seen.setdefault(key, f)
    return out_problems


def matrix_hash(m: Manifest) -> str:
    """The hash of what a shard's runs are: the plan record without where they ran (a fleet's devices, an adb
    serial, where each host keeps the model and engine files) or how it was spelt (the --set arguments, already
    applied). Each lab makes its own plan hash; its runs of one matrix are the same runs. That the model and the
    engine are the same is checked on their sha256 instead (provenance: _same_build)."""
    d = {k: v for k, v in m.campaign.dump().items() if k not in ("fleet", "overrides")}
    d["target"] = {k: v for k, v in d.get("target", {}).items() if k != "serial"}
    for part in [d.get("model"), d.get("engine"), *(d.get("engines") or {}).values()]:
        for k in ("path", "push_from"):
            (part or {}).pop(k, None)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def _plan_problems(loaded: list[tuple[Path, Manifest]]) -> list[str]:
    """Another plan, another engine build or model, a shard twice or of another count, a fidelity campaign."""
    f0, m0 = loaded[0]
    out = []
    shards: dict[str, Path] = {}
    for f, m in loaded:
        if matrix_hash(m) != matrix_hash(m0):
            out.append(f"{f}: plan {matrix_hash(m)} is not {f0}'s {matrix_hash(m0)} (another campaign file, or "
                       f"other --set arguments): a folder of another plan is not merged")
            continue
        if m.fidelity_ref is not None:
            out.append(f"{f}: a fidelity campaign's folder (its reference is its own); it is not merged")
        if m.shard is not None:
            if m.shard in shards:
                out.append(f"{f}: holds shard {m.shard}, as {shards[m.shard]} does; name one folder per shard")
            shards.setdefault(m.shard, f)
        if f is not f0:
            out += _same_build(f0, m0, f, m)
    counts = {s.split("/")[1] for s in shards}
    if len(counts) > 1:
        out.append(f"the folders are shards of {' and '.join(sorted(counts))} parts: merge the shards of one split")
    return out


def _versions(m: Manifest) -> dict[str, str]:
    return {k: e.version for k, e in m.engines.items()} if m.engines else {"": m.engine.version}


def _same_build(f0: Path, m0: Manifest, f: Path, m: Manifest) -> list[str]:
    out = []
    v0, v = _versions(m0), _versions(m)
    for k in sorted(set(v0) | set(v)):
        if v0.get(k) != v.get(k):
            out.append(f"{f}: engine{' ' + k if k else ''} {v.get(k)!r} is not {f0}'s {v0.get(k)!r}: runs from two "
                       f"builds do not compare")
    p0, p = m0.provenance, m.provenance
    if p0 is None or p is None:
        out.append(f"{f if p is None else f0}: no provenance (a folder from before manifest v3), so its model and "
                   f"engine cannot be checked against the other shards' (sha256); it is not merged")
    else:
        if p0.model_sha256 != p.model_sha256:
            out.append(f"{f}: its model files' sha256 differ from {f0}'s: runs of two models do not compare")
        for k in sorted(set(p0.engines) & set(p.engines)):
            a, b = p0.engines[k], p.engines[k]
            if (a.version, a.sha256, a.llama_cpp) != (b.version, b.sha256, b.llama_cpp):
                out.append(f"{f}: engine {k} is another build than {f0}'s (provenance): runs from two builds do "
                           f"not compare")
    return out


def _run_problems(loaded: list[tuple[Path, Manifest]]) -> list[str]:
    """Finished runs in two folders (one line per pair of folders), or without their files' hashes."""
    out = []
    owner: dict[str, Path] = {}
    for f, m in loaded:
        twice: dict[Path, list[str]] = {}
        for r in m.runs:
            if r.finished and r.run_id in owner:
                twice.setdefault(owner[r.run_id], []).append(r.run_id)
            elif r.finished:
                owner[r.run_id] = f
        for g, ids in twice.items():
            out.append(f"{f}: run(s) {' '.join(ids)} are finished there and in {g}; a run belongs to one shard: "
                       f"leave one of the folders out")
        unhashed = [r.run_id for r in m.runs if r.finished and r.sha256 is None]
        if unhashed:
            out.append(f"{f}: run(s) {' '.join(unhashed)} have no sha256 of their files (manifest v1), so they "
                       f"cannot be verified: `bmoe-bench report {f} --migrate` records them")
    return out


def _identity(m: Manifest) -> tuple[str, dict[str, Any]]:
    """A machine's label (host name, or adb serial) and its description without what changes from run to run."""
    desc = {k: v for k, v in m.target.dump().items() if k not in _VOLATILE}
    label = desc.get("hostname") or desc.get("serial") or desc.get("kind", "target")
    return str(label), desc


def _machines(loaded: list[tuple[Path, Manifest]]) -> tuple[dict[Path, str | None], dict[str, dict], list[str]]:
    """The device label each folder's unlabelled runs get (None when every folder ran on one and the same
    machine), the merged `devices`, and labels that name two different devices."""
    ids = {f: _identity(m) for f, m in loaded}
    one = len({repr(sorted(d.items())) for _, d in ids.values()}) == 1
    labels: dict[Path, str | None] = {}
    devices: dict[str, dict] = {}
    where: dict[str, Path] = {}
    out = []

    def add(label: str, desc: dict, f: Path) -> None:
        shown = {k: v for k, v in desc.items() if k not in _VOLATILE}
        if label in devices and devices[label] != shown:
            out.append(f"{f}: device {label} is not the device {where[label]} calls {label}; give the devices "
                       f"distinct labels")
        devices.setdefault(label, shown)
        where.setdefault(label, f)

    fleet = any(x.devices for _, x in loaded)
    for f, m in loaded:
        label, desc = ids[f]
        if label in devices and devices[label] != desc:  # two machines of one name: told apart by their shard
            label = f"{label} (shard {m.shard or 'all'})"
        labels[f] = None if one and not fleet else label
        if labels[f] is not None and any(r.device is None for r in m.runs if r.finished):
            add(label, desc, f)
        for label, desc in (m.devices or {}).items():
            add(label, desc, f)
    return labels, devices, out


def _verify_runs(loaded: list[tuple[Path, Manifest]]) -> list[str]:
    """Each finished run's files hashed where they are, against its manifest, before anything is copied: the
    work is bounded per shard (raw_hashes.Budget: no link followed, no FIFO opened, a file past 1 GiB or 8 GiB in
    all refused in one line), so a shard holding a sparse 200 GB file is refused without copying it."""
    bad = []
    for f, m in loaded:
        budget = Budget(f)
        for r in m.runs:
            if not r.finished or r.sha256 is None:
                continue
            src = run_dir(f, r.run_id)
            if not src.is_dir():
                bad.append(f"{src}: missing, though the manifest records run {r.run_id} as {r.status}; restore it")
                continue
            rel = src.relative_to(f).as_posix()
            for name in changed(f, rel, r.sha256, budget, every_file=True):
                n = name.removeprefix(f"{rel}/")
                how = "not recorded" if n not in r.sha256 else "missing" if not (src / n).exists() else "changed"
                bad.append(f"{f}/{name}: {how} since the run was committed (sha256 in {f}/manifest.json); "
                           f"restore it as committed, or leave that folder out")
    return bad


def _copy_runs(loaded: list[tuple[Path, Manifest]], out: Path) -> list[str]:
    """Every finished run's folder (verified in its shard: _verify_runs) copied into out and hashed there again:
    the files a bad copy changed."""
    bad = []
    (out / RUNS).mkdir()
    f0 = loaded[0][0]
    for name in (CAMPAIGN_FILE, PROMPTS_FILE):
        if (f0 / name).is_file():
            shutil.copy2(f0 / name, out / name)
    q = loaded[0][1].campaign.quality
    if q is not None and (not (out / PROMPTS_FILE).is_file() or sha256_file(out / PROMPTS_FILE) != q.prompts_sha256):
        bad.append(f"{f0}/{PROMPTS_FILE}: not the questions file its plan records (sha256); restore it as committed")
    copied = Budget(out)
    for f, m in loaded:
        for r in m.runs:
            if not r.finished or r.sha256 is None:
                continue
            src, dst = run_dir(f, r.run_id), run_dir(out, r.run_id)
            shutil.copytree(src, dst, symlinks=True)
            for name in changed(out, dst.relative_to(out).as_posix(), r.sha256, copied, every_file=True):
                bad.append(f"{out}/{name}: not the file it was copied from (sha256 in {f}/manifest.json); check "
                           f"the disk --out is on")
    return bad


def _undo(out: Path, made: bool) -> None:
    if made:
        shutil.rmtree(out, ignore_errors=True)
        return
    for p in out.iterdir():  # an empty folder given: empty it again
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)


def _device_provenance(m: Manifest, loaded: list[tuple[Path, Manifest]], labels: dict[Path, str | None]) -> None:
    """The merged folder's `provenance.devices`: each machine's fingerprint and storage under its label (a folder's
    own, or its fleet's devices')."""
    out: dict[str, DeviceProvenance] = {}
    for f, x in loaded:
        pv = x.provenance
        if pv is None:
            continue
        if labels[f] is not None and any(r.device is None for r in x.runs if r.finished):
            out.setdefault(labels[f], DeviceProvenance(fingerprint=pv.device, **({"storage": pv.storage}
                                                                              if pv.storage is not None else {})))
        for k, v in (pv.devices or {}).items():
            out.setdefault(k, v)
    if out and m.provenance is not None:
        m.provenance.devices = out


def _merged(loaded: list[tuple[Path, Manifest]], labels: dict[Path, str | None], devices: dict[str, dict]
            ) -> Manifest:
    f0, m0 = loaded[0]
    plan = m0.campaign
    runs: dict[str, RunRecord] = {}
    for f, m in loaded:
        for r in m.runs:
            if r.finished:
                r = r.model_copy()
                if r.device is None and labels[f] is not None:
                    r.device = labels[f]
                runs[r.run_id] = r
            else:
                runs.setdefault(r.run_id, r)
    for pos, rid in enumerate(plan.order_of_runs):  # runs of shards not given: pending, in their place
        if rid not in runs:
            rnd, cell = (int(x) for x in _ID.fullmatch(rid).groups())
            runs[rid] = RunRecord(run_id=rid, round=rnd - 1, cell=cell, position=pos, status="pending")
    ordered = sorted(runs.values(), key=lambda r: r.position)
    m = m0.model_copy(deep=True)
    m.runs = ordered
    m.created = min(x.created for _, x in loaded)
    m.sessions = sorted((s for _, x in loaded for s in x.sessions), key=lambda s: s.start)
    m.status = "complete" if all(r.finished for r in ordered) else "incomplete"
    if devices:
        m.devices = devices
        _device_provenance(m, loaded, labels)
    m.shard = None
    m.__pydantic_fields_set__.discard("shard")  # the whole plan's folder: no shard key at all, as an unsharded run's
    return m
