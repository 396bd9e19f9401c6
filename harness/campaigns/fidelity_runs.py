"""A fidelity campaign's engine runs: the reference, made once per campaign before the first run (its file and
log beside the manifest, hashed there), and a scored cell's scoring run against it, made right after the cell's
first-round speed run, its files in that run's folder (hashed with the run's other files)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Protocol

from rich.console import Console

from harness.campaigns import store
from harness.campaigns.fidelity import against_argv_tail, ref_argv_tail, text_of
from harness.campaigns.validate import Plan
from harness.errors import UserError
from harness.formats.campaign_fidelity import FidelityRef
from harness.formats.fidelity import read_fidelity_csv
from harness.formats.files import sha256_file
from harness.formats.folder import FIDELITY_CSV, FIDELITY_LOG, FIDELITY_REF, FIDELITY_REF_LOG
from harness.formats.manifest import Manifest, RunRecord, save_manifest
from harness.targets.base import Target

REF_RUN = "fidelity-ref"  # the reference's temporary folder: store.tmp_run_dir(folder, REF_RUN)


class Resolved(Protocol):
    model_path: str

    def argv0(self, label: str) -> list[str]: ...

    def versions(self) -> dict[str, str]: ...


PYTHON_ENGINE = "bmoe "  # how the Python engine's `--version` line starts (the C++ engine's is its version alone)


def ensure_reference(plan: Plan, m: Manifest, folder: Path, target: Target, res: Resolved, console: Console
                     ) -> None:
    """Make the campaign's reference unless the manifest has one that succeeded; a failure stops the campaign
    with one line (the folder stays resumable: the next run of the command makes it again)."""
    c = plan.campaign
    if c.fidelity is None or (m.fidelity_ref is not None and m.fidelity_ref.status == "ok"):
        return
    other = {k or "engine": v for k, v in res.versions().items() if not v.startswith(PYTHON_ENGINE)}
    if other:
        k, v = next(iter(other.items()))
        raise UserError(f"{folder}: fidelity: {k} says it is {v!r}, not the Python engine (its --version starts "
                        f"with {PYTHON_ENGINE!r}); only the Python engine has a logits output to score")
    base = next(x for x in plan.cells if x.is_base and x.engine == (c.engine_labels()[0] if c.engines else ""))
    tmp = store.tmp_run_dir(folder, REF_RUN)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    remote = f"{target.run_dir().rstrip('/')}/{FIDELITY_REF}"
    argv = res.argv0(base.engine) + ref_argv_tail(c, base, model=res.model_path, text=text_of(c), out=remote)
    console.print(f"fidelity: making the reference ({FIDELITY_REF}) with the base cell's flags")
    t0 = time.time()
    done = target.run(argv, timeout_s=c.timeout_s, outputs=[remote], out_dir=tmp, log_path=tmp / FIDELITY_REF_LOG)
    fetched = done.fetched.get(remote)
    reason = done.reason or (None if fetched is not None else "engine exited 0 but wrote no reference")
    names = [FIDELITY_REF_LOG]
    if fetched is not None:
        Path(fetched).replace(folder / FIDELITY_REF)
        names.append(FIDELITY_REF)
    if (tmp / FIDELITY_REF_LOG).is_file():
        (tmp / FIDELITY_REF_LOG).replace(folder / FIDELITY_REF_LOG)
    shutil.rmtree(tmp, ignore_errors=True)
    shown = [a if len(a) < 200 else f"<fidelity text, {len(a)} chars>" for a in argv]  # the text is in the plan
    m.fidelity_ref = FidelityRef(status="ok" if reason is None else "failed", reason=reason, argv=shown,
                                 start=store.iso(t0), wall_s=round(done.wall_s, 3),
                                 sha256={n: sha256_file(folder / n) for n in names if (folder / n).is_file()})
    save_manifest(folder, m)
    if reason is not None:
        raise UserError(f"{folder}: fidelity: the reference run failed ({reason}); see {folder / FIDELITY_REF_LOG}, "
                        f"then run the same command again to resume")


def score_cell(plan: Plan, m: Manifest, r: RunRecord, folder: Path, tmp: Path, target: Target, res: Resolved
               ) -> str | None:
    """Score a run's cell against the reference when it is a scored cell's first-round run (the plan record's
    `scored`): its figures and log into the run's folder; the failure reason, or None."""
    c, cell, rec = plan.campaign, plan.cells[r.cell], m.campaign.fidelity
    if rec is None or r.round != 0 or cell.index not in rec.scored:
        return None
    ref = target.stage(folder / FIDELITY_REF, "fidelity reference")
    remote = f"{target.run_dir().rstrip('/')}/{r.run_id}.{FIDELITY_CSV}"
    argv = res.argv0(cell.engine) + against_argv_tail(c, cell, model=res.model_path, ref=ref, csv=remote)
    done = target.run(argv, timeout_s=c.timeout_s, outputs=[remote], out_dir=tmp, log_path=tmp / FIDELITY_LOG)
    fetched = done.fetched.get(remote)
    if done.reason is not None or fetched is None:
        return f"fidelity scoring: {done.reason or 'engine exited 0 but wrote no figures'} (see {FIDELITY_LOG})"
    Path(fetched).replace(tmp / FIDELITY_CSV)
    try:
        n = len(read_fidelity_csv(tmp / FIDELITY_CSV).columns["kld"])
    except UserError as e:
        return f"fidelity scoring: its figures are unreadable: {e}"
    return None if n else "fidelity scoring: no position scored"

