"""What findings.md and `check` say about holding the device steady (pure: CampaignData in, lines out):

- throttling during a run (each run's `throttle` record, harness.devices.throttle): a † after each cell it touched
  in the results table, a line under the table naming the runs and the cap, and a warning;
- runs deferred by a strict temperature target (cooldown.on_timeout: defer) and still unrun: which cells lack
  runs because the device stayed hot, and how to run them;
- the cool-down's own terms for the setup line."""

from __future__ import annotations

from harness.formats.campaign import Cooldown
from harness.formats.outcome import ThrottleRecord
from harness.report.collect import CampaignData

MARK = "†"


def throttled(data: CampaignData) -> dict[int, list[tuple[str, ThrottleRecord]]]:
    """cell index -> [(run id, its record)] of its finished runs that were throttled, in run order."""
    out: dict[int, list[tuple[str, ThrottleRecord]]] = {}
    for r in data.runs:
        t = r.rec.throttle
        if r.rec.status == "ok" and t is not None and t.throttled:
            out.setdefault(r.rec.cell, []).append((r.run_id, t))
    return out


def how(t: ThrottleRecord) -> str:
    """'policy7 capped at 50% of its maximum, thermal status 3, for 4.1 s'."""
    parts = [", ".join(f"{k} capped at {v:.0%} of its maximum" for k, v in t.capped.items())] if t.capped else []
    if t.max_thermal_status:
        parts.append(f"thermal status {t.max_thermal_status}")
    return ", ".join(parts) + f", for {t.throttled_s:g} s"


def _cell_text(line: str) -> str | None:
    """The first column of a markdown table row, without the bold marks."""
    if not line.startswith("| "):
        return None
    return line[2:].split(" | ", 1)[0].strip("*")


def mark_table(lines: list[str], data: CampaignData) -> list[str]:
    """The results table with a † after each throttled cell and, under the table, one line per such cell."""
    hit = throttled(data)
    if not hit:
        return lines
    labels = {data.cells[i].label: i for i in hit}
    out, end = [], None
    for n, line in enumerate(lines):
        label = _cell_text(line)
        if label in labels:
            head, rest = line[2:].split(" | ", 1)
            line = f"| {head} {MARK} | {rest}"
        if end is None and n > 0 and lines[n - 1].startswith("|") and not line.startswith("|"):
            end = len(out)
        out.append(line)
    notes = [f"{MARK} {data.cells[i].label}: throttled during "
             + "; ".join(f"{rid} ({how(t)})" for rid, t in hit[i]) for i in sorted(hit)]
    at = end if end is not None else len(out)
    return out[:at] + ["", *notes] + out[at:]


def throttle_warnings(data: CampaignData) -> list[str]:
    hit = throttled(data)
    if not hit:
        return []
    runs = [rid for i in sorted(hit) for rid, _ in hit[i]]
    cells = ", ".join(data.cells[i].label for i in sorted(hit))
    return [f"throttling: the device throttled during {len(runs)} run(s) ({', '.join(runs[:6])}) of {cells} "
            f"({MARK} in the results): their tok/s are a throttled device's. Cool it between runs "
            f"(cooldown.between_runs_s, a lower cpu_temp_max_c with on_timeout: defer), or run it where it stays "
            f"cool, and compare again."]


def deferred_lines(data: CampaignData) -> list[str]:
    """Per cell, its runs left unrun because the gate gave up on them (cooldown.on_timeout: defer)."""
    by: dict[int, list] = {}
    for r in data.runs:
        if r.rec.deferred:
            by.setdefault(r.rec.cell, []).append(r.rec)
    out = []
    for i in sorted(by):
        recs = by[i]
        last = recs[-1].deferrals[-1]
        out.append(f"cell {i} ('{data.cells[i].label}') lacks {len(recs)} run(s) because the device did not meet the "
                   f"cooldown condition ({last.reason}): {', '.join(r.run_id for r in recs)} deferred, not run hot "
                   f"({sum(len(r.deferrals) for r in recs)} deferral(s)); cool the device and run the campaign again "
                   f"(`{data.manifest.reproduce}`)")
    return out


def cooldown_terms(cd: Cooldown) -> str:
    """The cool-down's terms beyond the gate, for the setup line ('' when none)."""
    terms = []
    if cd.between_runs_s:
        terms.append(f"a fixed {cd.between_runs_s:g} s cool-down before every run after the first on a device")
    if cd.on_timeout == "defer":
        terms.append(f"strict: a run the gate gave up on is deferred, never run hot (at most {cd.max_deferrals} "
                     f"deferral(s) per run per session)")
    return "; " + "; ".join(terms) if terms else ""
