"""`bmoe-manifest v3`: a campaign folder's manifest.json, the record of everything that defines its runs
and of every run's outcome, rewritten atomically as runs finish.

    format, version, created, status ("running", "complete", "interrupted", "stopped: ...")
    campaign            the plan (PlanRecord): what was asked, with the `--set` overrides applied and listed
                        (`overrides`, absent without any); hashed into plan_hash to find a folder to resume
    source, reproduce   the campaign file, and the command that runs it again (with the same --set arguments)
    harness, engine, model, target, read_bandwidth    what it ran with and on
    runs                one RunRecord per planned run, in plan order: its place, its outcome, and (v2) the
                        sha256 of every raw file of the run as committed (metrics.csv, state.jsonl,
                        engine.log, outcome.json, and a quality run's replies.jsonl)
                        and `deferrals`: each time the cooldown gate gave up and the run was not started
                        (cooldown.on_timeout: defer); a pending run with deferrals was left unrun, device hot
    sessions            one entry per `bmoe-bench run` that worked on the folder
    provenance          (v3) what exactly ran: the model files' sha256 (hashed on the target), each engine's
                        identity (bmoe: version, pinned llama.cpp commit, its source tree's commit and
                        whether it was dirty; external: its --version line and the binary's sha256), the
                        device's fingerprint and storage (on several devices each one's: `provenance.devices`);
                        each run's outcome has the model_sha256 it ran with
    devices, runs[].device    runs on several devices (a fleet, or shards merged from several machines): each
                        device's description by label, and the label of the one each run ran on
    shard               "k/n" in a folder that ran only shard k of n of the plan (`bmoe-bench run --shard`);
                        `bmoe-bench merge` joins the shards' folders into one without it

Versions: v1 had no file hashes; v2 no provenance. `load_manifest` upgrades an older file in memory (a v1 file's
runs then have no hashes to check: `unhashed_runs`; a v1 or v2 file has no provenance: `legacy`); `migrate_folder`
(harness.formats.manifest_migrate) rewrites it at the current version with the hashes of the files as they are now
(it cannot know what ran then, so provenance stays absent). A version newer than this code is refused, naming the file.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from harness.errors import UserError
from harness.formats.campaign import Cooldown, EngineEntry, EngineSpec, ModelSource, Precision, TargetSpec
from harness.formats.campaign_fidelity import FidelityRecord, FidelityRef
from harness.formats.campaign_fleet import FleetRecord
from harness.formats.campaign_prepare import PrepareSpec
from harness.formats.campaign_replicate import Replicate
from harness.formats.files import atomic_write_json
from harness.formats.folder import ENGINE_LOG as ENGINE_LOG  # campaigns/runner.py imports it from here
from harness.formats.folder import MANIFEST, RUNS
from harness.formats.folder import METRICS_FILE as METRICS_FILE  # likewise
from harness.formats.folder_guard import inside, read_json, refuse_links, shown
from harness.formats.outcome import Deferral, Outcome
from harness.formats.provenance_record import DeviceFingerprint as DeviceFingerprint  # re-exported
from harness.formats.provenance_record import DeviceProvenance as DeviceProvenance
from harness.formats.provenance_record import EngineIdentity as EngineIdentity
from harness.formats.provenance_record import Provenance
from harness.formats.raw_hashes import Budget, changed, checked_names
from harness.formats.raw_hashes import hash_files as hash_files  # campaigns/store.py imports it from here
from harness.formats.record import Record, validate
from harness.formats.target_desc import AdbTargetDesc as AdbTargetDesc  # re-exported: the manifest's records
from harness.formats.target_desc import CgroupDesc as CgroupDesc
from harness.formats.target_desc import LocalTargetDesc as LocalTargetDesc
from harness.formats.target_desc import TargetDesc

FORMAT = "bmoe-manifest"
VERSION = 3

FlagValue = bool | int | float | str | None
RUN_ID = re.compile(r"r[0-9]{2,6}-c[0-9]{2,6}")  # r<round>-c<cell>, 1-based round (expand.run_id writes them)
MAX_BYTES = 40 * 2**20  # larger was not written by bmoe-bench: 10 000 runs make 17 MB (bench-data/2026-12-03-scheduler)


def run_id(rnd: int, cell: int) -> str:
    """The id of the run of 0-based round `rnd` of cell `cell`: a folder name under runs/."""
    return f"r{rnd + 1:02d}-c{cell:02d}"


def checked_run_id(v: str) -> str:
    """v, when it is a run id (a folder under runs/: no other path may come from a manifest)."""
    if not isinstance(v, str) or not RUN_ID.fullmatch(v):
        raise ValueError(f"run id {shown(str(v))} is not of the form r<round>-c<cell> (r01-c02)")
    return v


def checked_shard(v: str | None) -> str | None:
    """v, when it is None or `k/n` (a shard of the plan, harness.campaigns.shard)."""
    if v is not None and not re.fullmatch(r"[0-9]{1,6}/[0-9]{1,6}", v):
        raise ValueError(f"shard {shown(str(v))} is not of the form k/n (2/3)")
    return v


# ---- the plan record: the campaign as planned (kept apart: it mirrors the campaign file's models) --------

class PlanCell(Record):
    index: int
    label: str
    flags: dict[str, FlagValue]  # the cell's full engine flags
    varied: dict[str, FlagValue]  # what differs from the base cell (empty for the base)
    engine: str | None = None  # engines axis only: the cell's engine label (set only there)
    setting: int | None = None  # engines axis only: the reference engine's cell with the same flags
    device: str | None = None  # a compare fleet only: the cell's device label (varied has it but on the first)


class QualityRecord(Record):
    """A quality campaign's questions and grading rule, fixed before the first reply (hashed with the plan)."""

    suite: str
    ids: list[str]  # the question ids, in the order every run answers them
    template: str
    dataset_sha256: str  # of the question file as shipped
    prompts_sha256: str  # of the campaign folder's prompts.jsonl, the file every run was given
    grader: str  # the grading rule's name and version (harness.quality.grade)
    grader_version: int


class PlanRecord(Record):
    name: str
    description: str
    model: ModelSource  # the campaign file's own models (harness.formats.campaign)
    target: TargetSpec
    engine: EngineSpec
    prompt: str
    tokens: int
    warmup_tokens: int
    repeats: int
    order: str
    seed: int
    cross: bool
    timeout_s: float
    cooldown: Cooldown
    base_flags: dict[str, FlagValue]
    cells: list[PlanCell]
    order_of_runs: list[str]
    _ids = field_validator("order_of_runs")(lambda v: [checked_run_id(x) for x in v])
    overrides: list[str] = []  # `--set KEY=VALUE` arguments applied to the file, as given (set only when any)
    quality: QualityRecord | None = None  # quality campaigns only (absent otherwise: older plans hash the same)
    engines: dict[str, EngineEntry] | None = None  # the engines axis, reference first (set only when given)
    traces: bool = False  # every run wrote io_trace.csv and compute_trace.csv (set only when true)
    # repeats driven by precision (set only when asked; min_repeats resolved): `repeats` rounds planned, whole
    # rounds added to `runs` (order_runs continued) until every ratio is precise or max_repeats
    precision: Precision | None = None
    fidelity: FidelityRecord | None = None  # fidelity campaigns only (absent otherwise: older plans hash the same)
    family: str | None = None  # the campaign's family (set only when given: older plans hash the same)
    fleet: FleetRecord | None = None  # fleet campaigns only (absent otherwise: older plans hash the same)
    sample_text: int = 0  # characters of each cell's text shown in findings (set only when asked)
    prepare: PrepareSpec | None = None  # the devices' preparation (set only when given: older plans hash the same)
    # replication (set only when asked: older plans hash the same): `repeats` rounds per try, tries after each other
    replicate: Replicate | None = None


# ---- what the campaign ran with ------------------------------------------------------------------------------

class HarnessDesc(Record):
    bmoe_bench: str
    commit: str | None
    dirty: bool | None


class SessionRecord(Record):
    start: str
    end: str | None  # None while it runs (or if it was killed)
    commit: str | None
    dirty: bool | None


class EngineDesc(Record):
    kind: str
    argv0: list[str]
    version: str  # the first line of `ENGINE --version`, asked on the target


class ModelDesc(Record):
    """The model as resolved: a recipe's generated file, a pushed file, or a path; keys as known."""

    recipe: dict[str, Any] | None = None
    file: str | None = None
    bytes: int | None = None
    path: str | None = None
    pushed_from: str | None = None
    hf: str | None = None  # a hub model (model: {hf: ...}); provenance.hub says what it resolved to


class ReadBandwidth(Record):
    mib_s: float | None  # None: not measured (method says why)
    method: str


# ---- runs ------------------------------------------------------------------------------------------------------

class RunSlot(Record):
    """A run's place in the plan."""

    run_id: str  # r<round>-c<cell>, 1-based round
    round: int  # 0-based repeat round
    cell: int  # PlanCell.index
    position: int  # 0-based place in the run order
    try_index: int | None = Field(None, ge=0)  # 0-based try of a replicating campaign (round // repeats); else unset
    _id = field_validator("run_id")(lambda v: checked_run_id(v))


class Attempt(Outcome):
    """A finished attempt: its outcome and the sha256 of each file of its run folder when committed (None
    for runs committed before manifest v2 and not migrated)."""

    sha256: dict[str, str] | None = None
    _names = field_validator("sha256")(lambda v: checked_names(v))


class RunRecord(Attempt, RunSlot):
    status: Literal["pending", "ok", "failed"] = "pending"
    previous_attempts: list[Attempt] = []  # earlier failed attempts, oldest first (--retry-failed)
    device: str | None = None  # the label of the device it ran on (Manifest.devices); None: the campaign's target
    deferrals: list[Deferral] = []  # each time the gate gave up and the run was deferred (cooldown.on_timeout)

    @property
    def finished(self) -> bool:
        return self.status != "pending"

    def slot(self) -> dict[str, Any]:
        """The run's place in the plan, and its earlier attempts if any."""
        keep = [*RunSlot.model_fields, "previous_attempts", "deferrals"]
        return {k: getattr(self, k) for k in keep if k in self.model_fields_set}

    def finish(self, outcome: Outcome, sha256: dict[str, str], device: str | None = None) -> RunRecord:
        """This run, finished with `outcome`, its files committed with these hashes (on a fleet: on `device`)."""
        done = {k: getattr(outcome, k) for k in Outcome.model_fields if k in outcome.model_fields_set}
        return RunRecord(**self.slot(), **done, sha256=sha256, **({"device": device} if device else {}))

    def defer(self, d: Deferral) -> RunRecord:
        """This (pending) run, deferred once more: not started because the gate gave up."""
        return RunRecord(**{**self.slot(), "deferrals": [*self.deferrals, d]}, status="pending")

    @property
    def deferred(self) -> bool:
        """Pending, and deferred at least once (the device did not meet the cooldown condition)."""
        return not self.finished and bool(self.deferrals)

    def retry(self) -> RunRecord:
        """This (failed) run pending again, its outcome kept as the newest previous attempt."""
        keep = [*Outcome.model_fields, "sha256"]
        attempt = Attempt(**{k: getattr(self, k) for k in keep if k in self.model_fields_set})
        return RunRecord(**{**self.slot(), "previous_attempts": [*self.previous_attempts, attempt]},
                         status="pending")


class Manifest(Record):
    format: Literal["bmoe-manifest"]
    version: int
    created: str
    status: str
    campaign: PlanRecord
    plan_hash: str
    source: str
    reproduce: str
    harness: HarnessDesc
    engine: EngineDesc  # with an engines axis: the reference engine's
    model: ModelDesc
    target: TargetDesc
    read_bandwidth: ReadBandwidth | None
    runs: list[RunRecord]
    sessions: list[SessionRecord]
    engines: dict[str, EngineDesc] | None = None  # engines axis: every engine, by label (set only there)
    provenance: Provenance | None = None  # v3; None in a folder from before it (legacy)
    fidelity_ref: FidelityRef | None = None  # a fidelity campaign's reference run, once made
    devices: dict[str, dict[str, Any]] | None = None  # runs on several devices: label -> its description
    shard: str | None = None  # "k/n": this folder holds shard k of n of the plan (`run --shard`); None: all of it
    _shard = field_validator("shard")(lambda v: checked_shard(v))
    _upgraded_from: int | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _distinct_runs(self) -> Manifest:
        ids = [r.run_id for r in self.runs]
        if len(set(ids)) != len(ids):
            raise ValueError(f"run id {next(i for i in ids if ids.count(i) > 1)} is recorded twice")
        rep, n = self.campaign.replicate, self.campaign.repeats
        for r in self.runs:  # a replicating plan's runs each name their try: the one their round falls in
            want = None if rep is None else r.round // n
            if r.try_index != want or want is not None and want >= rep.tries:
                raise ValueError(f"run {r.run_id}: try_index {r.try_index} where its round gives {want}")
        return self

    @property
    def upgraded_from(self) -> int | None:
        """The version of the file it was read from, when older than VERSION (upgraded in memory)."""
        return self._upgraded_from


def plan_hash(plan: PlanRecord) -> str:
    """What a resumed folder must share with the campaign file (the plan record, canonical JSON)."""
    return hashlib.sha256(json.dumps(plan.dump(), sort_keys=True).encode()).hexdigest()[:16]


# ---- reading and writing ----------------------------------------------------------------------------------------

def run_dir(folder: Path | str, run_id: str) -> Path:
    """runs/<run_id>/ of the folder (a UserError for anything but a run id, or a path resolving outside)."""
    try:
        checked_run_id(run_id)
    except ValueError as e:
        raise UserError(f"{folder}: {e}") from None
    return inside(folder, Path(folder) / RUNS / run_id)


def _upgrade(obj: dict, path: Path) -> tuple[dict, int | None]:
    """Bring a manifest's JSON to VERSION, one version at a time; (json, the version it had if older)."""
    v = obj.get("version")
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise UserError(f"{path}: manifest version {v!r} is not a version; this file was not written by bmoe-bench")
    if v > VERSION:
        raise UserError(f"{path}: manifest version {v} is newer than this bmoe-bench understands ({VERSION}); "
                        f"upgrade bmoe")
    if v == 1:  # v2 adds runs[].sha256, absent here: nothing to rewrite
        obj = {**obj, "version": 2}
    if obj["version"] == 2:  # v3 adds provenance and runs[].model_sha256, absent here: nothing to rewrite
        obj = {**obj, "version": 3}
    return obj, (v if v < VERSION else None)


def parse_manifest(obj: object, path: Path) -> Manifest:
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise UserError(f"{path}: not a {FORMAT} file")
    obj, old = _upgrade(obj, path)
    m = validate(Manifest, obj, str(path))
    assert isinstance(m, Manifest)
    m._upgraded_from = old
    return m


def load_manifest(folder: Path | str) -> Manifest:
    """The folder's manifest, once the folder is found to hold no link out of it (folder_guard)."""
    p = Path(folder) / MANIFEST
    if Path(folder).is_dir():
        refuse_links(folder)
    try:
        obj = read_json(p, MAX_BYTES)
    except FileNotFoundError:
        raise UserError(f"{folder}: no {MANIFEST}; is this a campaign folder under bench-data/?") from None
    return parse_manifest(obj, p)


def save_manifest(folder: Path | str, m: Manifest) -> None:
    """Always written at VERSION (an upgraded manifest is saved at it: its unhashed runs stay unhashed, its
    missing provenance missing)."""
    m.version = VERSION
    m._upgraded_from = None
    atomic_write_json(Path(folder) / MANIFEST, m.dump())


# ---- tamper evidence ----------------------------------------------------------------------------------------------

def raw_file_changes(folder: Path | str, m: Manifest) -> list[str]:
    """Raw files that differ from what the manifest recorded when their run was committed: changed,
    missing, or not there at commit, as paths relative to the folder (runs without hashes are skipped:
    see unhashed_runs). Only files inside the folder are hashed, with bounded work (harness.formats.raw_hashes)."""
    folder = Path(folder)
    budget, out = Budget(folder), []
    for r in m.runs:
        if r.finished and r.sha256 is not None:
            run_dir(folder, r.run_id)  # a run id, resolving inside the folder
            out += changed(folder, f"{RUNS}/{r.run_id}", r.sha256, budget, every_file=True)
    if m.fidelity_ref is not None:
        out += changed(folder, "", m.fidelity_ref.sha256, budget, every_file=False)
    return out


def unhashed_runs(m: Manifest) -> list[str]:
    """Finished runs without file hashes: legacy in a v1 manifest, removed entries in a later one."""
    return [r.run_id for r in m.runs if r.finished and r.sha256 is None]


def hashes_removed(m: Manifest) -> list[str]:
    """Finished runs without file hashes in a manifest that records them at every commit (v2 on; a file
    saying v1 but holding hashes or provenance was edited): their tamper check was switched off."""
    v1 = m.upgraded_from == 1 and m.provenance is None and all(r.sha256 is None for r in m.runs)
    return [] if v1 else unhashed_runs(m)


def removed_message(runs: list[str]) -> str:
    return (f"run(s) {' '.join(runs)} have no sha256 in {MANIFEST}, which records them at every commit: the "
            f"entries were removed, so their raw files cannot be checked; restore {MANIFEST} as committed")


def legacy(m: Manifest) -> bool:
    """A folder from before manifest v3: what model, engine build and device ran is not recorded."""
    return m.provenance is None
