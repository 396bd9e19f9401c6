"""`bmoe-bench check DIR...`: is a campaign folder's result sound enough to cite? One line per problem:

- every planned cell present in the manifest with a result, every planned run recorded, none pending;
- every ok run valid: its folder and metrics CSV there, the `# summary` line present, as many token rows
  as the run recorded, at least `MIN_KEPT_TOKENS` tokens after the warm-up and `MIN_KEPT_WALL_S` seconds
  of their summed wall time (below that a run's tok/s is timer noise);
- every failed run accounted for: a reason recorded;
- provenance complete (manifest v3: the model's sha256, every engine's identity, the device fingerprint)
  and every run's model sha256 equal to the campaign's; a folder from before v3 passes as *legacy*, with
  a note (what ran then cannot be recovered now: hashing today's file would claim what was not checked);
- the lossless audit clean (harness.report.audit);
- raw files intact (their sha256 in the manifest); a finished run without its sha256 in a manifest from v2 on
  is a problem (the entry was removed); runs from before file hashes (manifest v1) pass as legacy, with a
  note naming the migration.

A folder may carry `acknowledged.txt`: problem lines (exactly as this check prints them, without the
folder) that a reviewer has accepted, each under a `# ` comment saying why; they are reported as
acknowledged, not as problems. Any other problem, or an acknowledged line that no longer occurs, fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness import stats
from harness.errors import UserError
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
from harness.report.collect import CampaignData, load_campaign_data
from harness.report.results import compute_results

MIN_KEPT_TOKENS = 4  # tokens after the warm-up, per ok run
MIN_KEPT_WALL_S = 0.2  # their summed wall time, per ok run
ACKNOWLEDGED = "acknowledged.txt"


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
    for c in p.cells:
        runs = [r for r in m.runs if r.cell == c.index]
        if runs and all(r.status == "failed" for r in runs):
            out.append(f"cell {c.index} ('{c.label}'): every run failed, so it has no result")
    return out


def _provenance(data: CampaignData) -> tuple[list[str], list[str]]:
    m = data.manifest
    if legacy(m):
        return [], ["legacy folder (from before manifest v3): the model's sha256, the engine build and the device "
                    "fingerprint were not recorded; its results stand on its description alone"]
    pv = m.provenance
    assert pv is not None
    out, notes = [], []
    if not pv.model_sha256:
        out.append("provenance: no model sha256")
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
    d = pv.device
    need = ("fingerprint", "soc", "android", "mem_total_mib") if d.kind == "adb" else ("cpu_model", "kernel")
    gaps = [f for f in need if getattr(d, f) is None]
    if gaps:
        out.append(f"provenance: device fingerprint lacks {', '.join(gaps)}")
    for r in m.runs:
        if r.status == "ok" and r.model_sha256 is not None and r.model_sha256 != pv.model_sha256:
            out.append(f"run {r.run_id} ran with another model file than the campaign's (sha256 differs)")
        elif r.status == "ok" and r.model_sha256 is None:
            out.append(f"run {r.run_id}: no model sha256 recorded")
    return out, notes


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


def read_acknowledged(folder: Path) -> list[str]:
    p = folder / ACKNOWLEDGED
    if not p.is_file():
        return []
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{p}: not UTF-8 (byte {e.start})") from None
    lines = [ln.strip() for ln in text.splitlines()]
    return [ln for ln in lines if ln and not ln.startswith("#")]


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


def check_folder(folder: Path | str) -> CheckResult:
    folder = Path(folder)
    data = load_campaign_data(folder)
    res = CheckResult(folder)
    prov, notes = _provenance(data)
    hashes, unhashed = _hashes(data)
    notes += unhashed
    prec, prec_notes = _precision(data)
    notes += prec_notes
    found = [*audit(data).violations(), *_runs(data), *prov, *hashes, *prec]
    ack = read_acknowledged(folder)
    res.problems = [p for p in found if p not in ack]
    res.problems += [f"{ACKNOWLEDGED}: '{a}' no longer occurs: remove it" for a in ack if a not in found]
    res.notes = notes + [f"acknowledged ({ACKNOWLEDGED}): {a}" for a in ack if a in found]
    return res
