"""A traced campaign's part of the report (campaign key `traces: true`): which run and token the timeline
plot shows, and each traced cell's per-token split from the traces (ms computing, waiting on reads and in the
hook, read lanes busy)."""

from __future__ import annotations

from dataclasses import dataclass

from harness.formats.traces import UNFILLED, layer_totals
from harness.report.collect import CampaignData, RunData
from harness.report.timeline import DECODE, median_step, timeline_png, token_view

TIMELINE = "timeline.png"


@dataclass(frozen=True)
class Shown:
    run: RunData
    step: int


def traced_runs(data: CampaignData) -> list[RunData]:
    return [r for r in sorted(data.runs, key=lambda r: r.rec.position)
            if r.ok and r.io_trace is not None and r.compute_trace is not None]


def shown(data: CampaignData) -> Shown | None:
    """The run the timeline shows (the first traced run in run order) and its median-wall token after warm-up."""
    runs = traced_runs(data)
    if not runs:
        return None
    r = runs[0]
    assert r.compute_trace is not None
    return Shown(r, median_step(r.compute_trace, skip=data.warmup))


def timeline_plot(data: CampaignData) -> dict[str, bytes]:
    s = shown(data)
    if s is None:
        return {}
    assert s.run.io_trace is not None and s.run.compute_trace is not None
    label = {c.index: c.label for c in data.cells}[s.run.rec.cell]
    v = token_view(s.run.io_trace, s.run.compute_trace, s.step)
    return {TIMELINE: timeline_png(v, f"{label}, run {s.run.run_id}, token {s.step}: {v.wall_ms:.1f} ms, "
                                      f"{len(v.reads)} reads")}


def _split(r: RunData, warmup: int) -> tuple[int, float, float, float, float]:
    """(tokens, ms/token computing, waiting, in the hook, lane-busy fraction) over decode tokens after warm-up."""
    assert r.io_trace is not None and r.compute_trace is not None
    tot = {"compute": 0, "wait": 0, "hook": 0}
    steps: set[int] = set()
    for (_, phase, step, _), d in layer_totals(r.compute_trace.rows).items():
        if phase == DECODE and step > warmup:
            steps.add(step)
            for k in tot:
                tot[k] += d[k]
    n = max(len(steps), 1)
    busy = sum(x.finished_ns - x.started_ns for x in r.io_trace.rows
               if x.phase == DECODE and x.step in steps and x.finished_ns != UNFILLED)
    lanes = int(r.io_trace.meta.get("io_threads", 1) or 1)
    wall = sum(tot.values())
    return len(steps), tot["compute"] / n / 1e6, tot["wait"] / n / 1e6, tot["hook"] / n / 1e6, \
        busy / (lanes * wall) if wall else 0.0


def traced_section(data: CampaignData) -> list[str]:
    s = shown(data)
    if s is None:
        return []
    labels = {c.index: c.label for c in data.cells}
    out = ["## Timeline (traced runs)", "",
           f"Every run wrote an io_trace and a compute_trace (tracing perturbs the run a little: see their "
           f"preambles). The plot is run {s.run.run_id} ({labels[s.run.rec.cell]}), decode token {s.step} (the "
           f"median wall time after warm-up): the compute thread's intervals by layer span against each read "
           f"lane.", "", f"![one token's timeline](plots/{TIMELINE})", "",
           "| cell | run | tokens | compute ms/token | wait ms/token | hook ms/token | lanes busy |",
           "|---|---|---|---|---|---|---|"]
    for r in traced_runs(data):
        n, c, w, h, busy = _split(r, data.warmup)
        out.append(f"| {labels[r.rec.cell]} | {r.run_id} | {n} | {c:.2f} | {w:.2f} | {h:.2f} | {busy:.0%} |")
    return out + [""]
