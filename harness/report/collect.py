"""Load a campaign folder into memory: the manifest (plan, cells, run records) and each run's metrics CSV
and device-state samples, all through harness.formats. Configuration comes from the manifest and the CSV
preambles, never from file or folder names (run folders are found through the manifest's run ids). A damaged
raw file makes its run invalid (the reason in the findings); one no bmoe-bench writes (folder_guard.NotOurs: far
too large, nested too deep) refuses the folder in one line."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import UserError
from harness.formats.devstate import DeviceSample, read_states
from harness.formats.folder import COMPUTE_TRACE_FILE, IO_TRACE_FILE, METRICS_FILE, STATE_FILE
from harness.formats.folder_guard import NotOurs
from harness.formats.manifest import (
    Manifest,
    PlanCell,
    PlanRecord,
    RunRecord,
    load_manifest,
    run_dir,
)
from harness.formats.metrics_csv import Metrics, read_metrics
from harness.formats.traces import TraceFile, read_compute_trace, read_io_trace


@dataclass
class RunData:
    rec: RunRecord  # the manifest's record of this run
    metrics: Metrics | None  # None for a failed run without a CSV
    states: list[DeviceSample] = field(default_factory=list)
    problem: str | None = None  # why a run the manifest calls ok cannot be used
    io_trace: TraceFile | None = None  # io_trace.csv, in a campaign with traces
    compute_trace: TraceFile | None = None  # compute_trace.csv, likewise

    @property
    def run_id(self) -> str:
        return self.rec.run_id

    @property
    def ok(self) -> bool:
        return self.rec.status == "ok" and self.metrics is not None and self.problem is None


@dataclass
class CampaignData:
    folder: Path
    manifest: Manifest
    runs: list[RunData]

    @property
    def plan(self) -> PlanRecord:
        return self.manifest.campaign

    @property
    def cells(self) -> list[PlanCell]:
        return self.plan.cells

    @property
    def warmup(self) -> int:
        return self.plan.warmup_tokens

    def cell_runs(self, index: int) -> list[RunData]:
        return [r for r in self.runs if r.rec.cell == index]


MAX_READ = 2**29  # raw bytes one folder's report reads (10,000 runs wrote 50 MB; a 64 MiB CSV takes 600 MB to read)


def _sizes(d: Path) -> int:
    """Bytes of the raw files of run folder d the report reads."""
    out = 0
    for name in (METRICS_FILE, STATE_FILE, IO_TRACE_FILE, COMPUTE_TRACE_FILE):
        try:
            out += os.lstat(d / name).st_size
        except OSError:
            pass
    return out


def load_campaign_data(folder: Path | str) -> CampaignData:
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder}: no such campaign folder")
    m = load_manifest(folder)
    runs = []
    left = MAX_READ
    for rec in m.runs:
        if not rec.finished:
            runs.append(RunData(rec, None))
            continue
        d = run_dir(folder, rec.run_id)
        left -= _sizes(d)
        if left < 0:
            raise NotOurs(f"{folder}: its runs' raw files hold more than {MAX_READ // 2**20} MiB to read (at run "
                          f"{rec.run_id}), far beyond any campaign bmoe-bench writes; refused")
        metrics, problem = None, None
        csv = d / METRICS_FILE
        if csv.is_file():
            try:
                metrics = read_metrics(csv)
            except NotOurs:
                raise
            except UserError as e:
                problem = str(e)
            if metrics is not None and rec.status == "ok":
                problem = metrics.problem(rec.tokens)
        elif rec.status == "ok":
            problem = f"{csv} is missing"
        try:
            states = read_states(d / STATE_FILE)
        except NotOurs:
            raise
        except UserError as e:
            states, problem = [], problem or str(e)
        traces: dict[str, TraceFile | None] = {}
        for key, name, read in (("io_trace", IO_TRACE_FILE, read_io_trace), ("compute_trace", COMPUTE_TRACE_FILE,
                                                                        read_compute_trace)):
            traces[key] = None
            if (d / name).is_file():
                try:
                    traces[key] = read(d / name)
                except NotOurs:
                    raise
                except UserError as e:
                    problem = problem or str(e)
        if problem is not None:  # the same text whatever path the folder was named by
            problem = problem.replace(f"{folder}/", "")
        runs.append(RunData(rec, metrics, states, problem, **traces))
    return CampaignData(folder=folder, manifest=m, runs=runs)
