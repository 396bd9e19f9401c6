"""`bmoe-bench check DIR...`: is a campaign folder's result sound enough to cite? One line per problem:

- every planned cell present in the manifest with a result, every planned run recorded, none pending (a run
  deferred by a strict temperature target is named with its cell: the device stayed hot);
- every ok run valid: its folder and metrics CSV there, the `# summary` line present, as many token rows
  as the run recorded, at least `MIN_KEPT_TOKENS` tokens after the warm-up and `MIN_KEPT_WALL_S` seconds
  of their summed wall time (below that a run's tok/s is timer noise);
- every failed run accounted for: a reason recorded;
- provenance complete (manifest v3: the model's sha256, every engine's identity, the device fingerprint; on
  several devices each device's fingerprint and state: harness.report.check_devices) and every run's model
  sha256 equal to the campaign's; a folder from before v3 passes as *legacy*, with
  a note (what ran then cannot be recovered now: hashing today's file would claim what was not checked);
- the lossless audit clean (harness.report.audit);
- each device-preparation journal (prepared/) readable; one left unrestored is a note naming `devices --restore`;
- a campaign with `replicate:`: its headline comparison replicated over every try (harness.report.replication;
  replicated is a note, not replicated or incomplete a problem);
- each streamed run's O_DIRECT as its engine reports it agrees with the storage probe of its device
  (harness.report.check_odirect);
- raw files intact (their sha256 in the manifest); a finished run without its sha256 in a manifest from v2 on
  is a problem (the entry was removed); runs from before file hashes (manifest v1) pass as legacy, with a
  note naming the migration.

A folder may carry `acknowledged.txt`: problem lines (exactly as this check prints them, without the
folder) that a reviewer has accepted, each under a `# ` comment saying why (a block of lines shares the
comment above it; a blank line ends the block); they are reported as acknowledged, not as problems. Any other
problem, an acknowledged line without its reason, or one that no longer occurs, fails. A missing or wrong
sha256 (a raw file changed, a run's hashes removed, a run's model not the campaign's) can never be
acknowledged: a line naming one is itself a problem, and the hash problem stays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from harness import stats
from harness.formats.folder_guard import read_text
from harness.formats.manifest import (
    METRICS_FILE,
    hashes_removed,
    legacy,
    raw_file_changes,
    removed_message,
    run_dir,
    unhashed_runs,
)
from harness.report.audit import audit
from harness.report.check_devices import check_devices, gaps, several
from harness.report.check_odirect import check_odirect
from harness.report.collect import CampaignData, load_campaign_data
from harness.report.prepared_md import journal_states
from harness.report.replicate_stats import REPLICATED
from harness.report.replication import replication_of
from harness.report.results import compute_results
from harness.report.steady_md import deferred_lines, throttled

MIN_KEPT_TOKENS = 4  # tokens after the warm-up, per ok run
MIN_KEPT_WALL_S = 0.2  # their summed wall time, per ok run
ACKNOWLEDGED = "acknowledged.txt"
ACK_MAX_BYTES = 2**20  # a reviewer's notes; the largest committed is 1 KB


@dataclass
class CheckResult:
    folder: Path
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # not failures: legacy provenance, acknowledged lines

    @property
    def ok(self) -> bool:
        return not self.problems


def _runs(data: CampaignData) -> list[str]:
    out = []
    p, m = data.plan, data.manifest
    planned = {c.index for c in p.cells}
    recorded = {r.cell for r in m.runs}
    out += [f"cell {i} ('{p.cells[i].label}') has no run in the manifest" for i in sorted(planned - recorded)]
    have = {r.run_id for r in m.runs}
    missing = [rid for rid in p.order_of_runs if rid not in have]
    if missing:
        out.append(f"planned runs not in the manifest: {' '.join(missing)}")
    for r in data.runs:
        rec = r.rec
        if rec.deferred:
            continue  # deferred by the cooldown gate: said per cell below (deferred_lines)
        if not rec.finished:
            out.append(f"run {rec.run_id} has not run (pending): finish the campaign (`{m.reproduce}`)")
        elif rec.status == "failed":
            if not rec.reason:
                out.append(f"run {rec.run_id} failed without a recorded reason")
        elif not run_dir(data.folder, rec.run_id).is_dir():
            out.append(f"run {rec.run_id}: its folder runs/{rec.run_id}/ is missing")
        elif r.problem is not None or r.metrics is None:
            out.append(f"run {rec.run_id}: {r.problem or f'no {METRICS_FILE}'}")
        else:
            wall = r.metrics.wall_ms(data.warmup)
            if len(wall) < MIN_KEPT_TOKENS:
                out.append(f"run {rec.run_id}: {len(wall)} tokens kept after the {data.warmup} warm-up, fewer than "
                           f"{MIN_KEPT_TOKENS}")
            elif float(wall.sum()) / 1000 < MIN_KEPT_WALL_S:
                out.append(f"run {rec.run_id}: its kept tokens took {float(wall.sum()) / 1000:.3f} s, under "
                           f"{MIN_KEPT_WALL_S} s")
    out += deferred_lines(data)
    for c in p.cells:
        runs = [r for r in m.runs if r.cell == c.index]
        if runs and all(r.status == "failed" for r in runs):
            out.append(f"cell {c.index} ('{c.label}'): every run failed, so it has no result")
    return out


def _provenance(data: CampaignData) -> tuple[list[str], list[str], list[str]]:
    """(problems, notes, hash problems: a model sha256 missing or not the campaign's)."""
    m = data.manifest
    if legacy(m):
        return [], ["legacy folder (from before manifest v3): the model's sha256, the engine build and the device "
                    "fingerprint were not recorded; its results stand on its description alone"], []
    pv = m.provenance
    assert pv is not None
    out, notes, hashes = [], [], []
    if not pv.model_sha256:
        hashes.append("provenance: no model sha256")
    labels = list(m.campaign.engines) if m.campaign.engines else [m.campaign.engine.kind]
    for k in labels:
        e = pv.engines.get(k)
        if e is None:
            out.append(f"provenance: no identity for engine {k}")
        elif e.sha256 is None and e.llama_cpp is None:
            out.append(f"provenance: engine {k} has neither a binary sha256 nor a llama.cpp commit")
        elif e.llama_cpp is not None and e.commit is None:
            out.append(f"provenance: engine {k}: the commit of its source tree is unknown")
        elif e.dirty:
            notes.append(f"engine {k} ran from a tree with uncommitted changes (commit {e.commit[:12]})")
    if several(m):  # each device's fingerprint and state (harness.report.check_devices)
        more, more_notes = check_devices(m)
        out += more
        notes += more_notes
    else:
        lack = gaps(pv.device)
        if lack:
            out.append(f"provenance: device fingerprint lacks {', '.join(lack)}")
        if pv.storage is None:
            notes.append("provenance: the storage the model was read from was not recorded (a folder from before it)")
    for r in m.runs:
        if r.status == "ok" and r.model_sha256 is not None and r.model_sha256 != pv.model_sha256:
            hashes.append(f"run {r.run_id} ran with another model file than the campaign's (sha256 differs)")
        elif r.status == "ok" and r.model_sha256 is None:
            hashes.append(f"run {r.run_id}: no model sha256 recorded")
    return out, notes, hashes


def _hashes(data: CampaignData) -> tuple[list[str], list[str]]:
    out = [f"{p} changed since its run was committed (sha256 in manifest.json)"
           for p in raw_file_changes(data.folder, data.manifest)]
    removed = hashes_removed(data.manifest)
    if removed:
        return [*out, removed_message(removed)], []
    un = unhashed_runs(data.manifest)
    notes = [f"legacy: {len(un)} run(s) from before file hashes (manifest v1) cannot be checked: "
             f"`bmoe-bench report {data.folder} --migrate` records them as they are now"] if un else []
    return out, notes


class Acknowledged(NamedTuple):
    line: int  # in acknowledged.txt
    text: str  # the problem line accepted
    reason: str  # the comment above it ("" when there is none)


def read_acknowledged(folder: Path) -> list[Acknowledged]:
    """The lines of the folder's acknowledged.txt, each with the `# ` comment of its block (read without following
    a link, at most ACK_MAX_BYTES)."""
    try:
        text = read_text(folder / ACKNOWLEDGED, ACK_MAX_BYTES)
    except FileNotFoundError:
        return []
    out, reason = [], []
    for n, raw in enumerate(text.splitlines(), start=1):
        ln = raw.strip()
        if not ln:
            reason = []
        elif ln.startswith("#"):
            if ln.lstrip("#").strip():
                reason.append(ln.lstrip("#").strip())
        else:
            out.append(Acknowledged(n, ln, " ".join(reason)))
    return out


def _acknowledge(found: list[str], hashes: list[str], acks: list[Acknowledged]) -> tuple[list[str], list[str]]:
    """(problems, notes): the problems found less those acknowledged with a reason; a hash problem always stays."""
    ok = {a.text for a in acks if a.reason and a.text not in hashes}
    problems = [p for p in found if p not in ok] + hashes
    notes = [f"acknowledged ({ACKNOWLEDGED}): {a.text}" for a in acks if a.text in ok and a.text in found]
    for a in acks:
        where = f"{ACKNOWLEDGED}:{a.line}"
        if a.text in hashes:
            problems.append(f"{where}: acknowledges a missing or wrong sha256, which cannot be acknowledged: restore "
                            f"the files as committed (or run the runs again) and remove the line")
        elif a.text not in found:
            problems.append(f"{where}: '{a.text[:200]}' no longer occurs: remove it")
        elif not a.reason:
            problems.append(f"{where}: no reason: put a `# ` comment above it saying why it is accepted")
    return problems, notes


def _precision(data: CampaignData) -> tuple[list[str], list[str]]:
    """A campaign with `precision:`: (problems, notes). Not decided (runs pending, or fewer rounds than its rule
    ran to) is a problem; stopped precise or at the maximum is a note naming the rounds."""
    if data.plan.precision is None:
        return [], []
    q = compute_results(data).precision
    assert q is not None
    rule = f"precision +-{q.half_width:.0%}, {q.min_rounds}-{q.max_rounds} rounds"
    if q.decision == stats.PRECISE:
        return [], [f"{rule}: every ratio reached it after {q.rounds} rounds"]
    if q.decision == stats.AT_MAX:
        return [], [f"{rule}: stopped at the maximum, {q.rounds} rounds, with a ratio not within it (findings.md "
                    "names the cells)"]
    if q.decision == stats.NO_RUNS:
        return [], [f"{rule}: stopped after {q.rounds} rounds because a cell had no usable run (its failures are "
                    "listed above)"]
    return [f"{rule}: not decided after {q.rounds} rounds (runs pending or rounds missing); resume the campaign"], []


def _replication(data: CampaignData) -> tuple[list[str], list[str]]:
    """A campaign with `replicate:`: (problems, notes). Replicated is a note; not replicated (or not every try done)
    is a problem, which a reviewer may acknowledge with its reason."""
    r = replication_of(data)
    if r is None:
        return [], []
    line = r.verdict.line()
    return ([], [line]) if r.verdict.state == REPLICATED else ([line], [])


def check_folder(folder: Path | str) -> CheckResult:
    folder = Path(folder)
    data = load_campaign_data(folder)
    res = CheckResult(folder)
    prov, notes, model_hashes = _provenance(data)
    hashes, unhashed = _hashes(data)
    notes += unhashed
    prec, prec_notes = _precision(data)
    notes += prec_notes
    hot = [rid for runs in throttled(data).values() for rid, _ in runs]
    if hot:
        notes.append(f"the device throttled during run(s) {' '.join(hot)} (findings.md marks their cells)")
    states, unreadable = journal_states(folder)
    notes += [f"device {serial} was left prepared ({state}, not restored): `bmoe-bench devices --restore {folder}` "
              f"puts it back" for serial, state in states if state != "restored"]
    rep, rep_notes = _replication(data)
    notes += rep_notes
    odirect, odirect_notes = check_odirect(data)
    notes += odirect_notes
    found = [*audit(data).violations(), *_runs(data), *prov, *prec, *rep, *odirect, *unreadable]
    res.problems, acked = _acknowledge(found, [*model_hashes, *hashes], read_acknowledged(folder))
    res.notes = notes + acked
    return res
