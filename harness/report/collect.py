"""Load a campaign folder into memory: the manifest (plan, cells, run records) and each run's metrics CSV
and device-state samples. Configuration comes from the manifest and the CSV preambles, never from file
or folder names (run folders are found through the manifest's run ids)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from harness.campaigns import store
from harness.errors import UserError
from harness.formats.metrics_csv import Metrics, read_metrics


@dataclass
class RunData:
    rec: dict  # the manifest's record of this run
    metrics: Metrics | None  # None for a failed run without a CSV
    states: list[dict] = field(default_factory=list)
    problem: str | None = None  # why a run the manifest calls ok cannot be used

    @property
    def run_id(self) -> str:
        return self.rec["run_id"]

    @property
    def ok(self) -> bool:
        return self.rec.get("status") == "ok" and self.metrics is not None and self.problem is None


@dataclass
class CampaignData:
    folder: Path
    manifest: dict
    runs: list[RunData]

    @property
    def plan(self) -> dict:
        return self.manifest["campaign"]

    @property
    def cells(self) -> list[dict]:
        return self.plan["cells"]

    @property
    def warmup(self) -> int:
        return int(self.plan.get("warmup_tokens", 0))

    def cell_runs(self, index: int) -> list[RunData]:
        return [r for r in self.runs if r.rec["cell"] == index]


def _states(p: Path) -> list[dict]:
    if not p.is_file():
        return []
    out = []
    for line in p.read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def load_campaign_data(folder: Path | str) -> CampaignData:
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder}: no such campaign folder")
    m = store.load_manifest(folder)
    runs = []
    for rec in m["runs"]:
        if rec.get("status") == "pending":
            runs.append(RunData(rec, None))
            continue
        d = store.run_dir(folder, rec["run_id"])
        metrics, problem = None, None
        csv = d / "metrics.csv"
        if csv.is_file():
            try:
                metrics = read_metrics(csv)
            except UserError as e:
                problem = str(e)
        elif rec.get("status") == "ok":
            problem = f"{csv} is missing"
        runs.append(RunData(rec, metrics, _states(d / "state.jsonl"), problem))
    return CampaignData(folder=folder, manifest=m, runs=runs)
