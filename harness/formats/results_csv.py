"""`bmoe-results v2`: a campaign folder's results.csv, one row per cell, written by `bmoe-bench report`
from the raw files (and checked against them by `report --check`).

Layout: a `# bmoe-results v2` line, a header, one row per cell in plan order. Columns, in order:
`cell`, then the configuration keys that vary between cells (`cfg.*`, `mode`: the CSV preambles'), then
COLUMNS; then OPTIONAL ones, each only where some cell measured it. An empty value = none or unmeasured.

Versions: v1 (no version line; every folder reported before 2026-12-03) had no `ci_method` and
`ratio_method`: its intervals were percentile bootstraps (`ci_basis` runs or tokens). v2 adds the two
method columns (harness.stats names the methods), and a single run has no `tok_s_lo`/`tok_s_hi`: no
interval between runs (its within-run spread is in findings.md). `read_results` reads both.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from harness.errors import UserError
from harness.formats.folder_guard import MAX_RAW, read_capped

FORMAT = "bmoe-results"
VERSION = 2

COLUMNS: dict[str, str] = {  # name -> meaning
    "runs_ok": "successful runs", "runs_failed": "failed or unusable runs",
    "tok_s": "mean over runs of tok/s (tokens kept / their summed wall time)",
    "tok_s_lo": "its 95% interval, low (empty for one run)", "tok_s_hi": "its 95% interval, high",
    "ci_basis": "runs, or tokens (one run)", "ci_method": "how the tok/s interval was computed (v2)",
    "ratio": "mean tok/s / the base cell's (1 for the base)", "ratio_lo": "its 95% interval, low",
    "ratio_hi": "its 95% interval, high", "ratio_method": "how the ratio's interval was computed (v2)",
    "s_per_tok": "mean wall s/token", "io_wait_s_per_tok": "waiting for expert reads",
    "mgmt_s_per_tok": "cache management", "mgmt_cpu_s_per_tok": "of which the compute thread's CPU",
    "mgmt_hidden_s_per_tok": "of which beside demand reads", "compute_s_per_tok": "the residual",
    "mib_read_per_tok": "MiB read per token", "hit_pct": "cache hit % at the last token",
    "peak_rss_mib": "peak RSS", "cap_peak_mib": "the memory cap cgroup's peak", "majflt_per_tok": "major faults",
}
OPTIONAL: dict[str, str] = {
    "evictor_cpu_s_per_tok": "decode evictions' CPU on the evictor thread",
    "prefetch_mib_per_tok": "speculative MiB read per token", "prefetch_wasted_pct": "of which evicted unused",
    "draft_kept_per_batch": "guess-ahead: guesses kept per verify batch", "draft_kept_pct": "of the guesses made, kept",
}
V2_ONLY = ("ci_method", "ratio_method")


def header_problem(keys: list[str]) -> str | None:
    """What is wrong with a header against the declaration (cell, config keys, COLUMNS, OPTIONAL ones), or None."""
    rest = [k for k in keys[1:] if not (k.startswith("cfg.") or k == "mode")]
    want = [*COLUMNS, *(k for k in OPTIONAL if k in keys)]
    if keys[:1] != ["cell"] or rest != want:
        return f"results.csv columns {keys} are not the declared ones (cell, config keys, {', '.join(want)})"
    return None


def results_text(rows: list[dict[str, object]]) -> str:
    """The file: version line, header (the first row's keys, as declared), rows; floats with 6 significant
    digits. Every row has the same keys."""
    if not rows:
        return f"# {FORMAT} v{VERSION}\n"
    bad = header_problem(list(rows[0]))
    if bad is not None:
        raise ValueError(bad)
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(rows[0].keys())
    for r in rows:
        w.writerow(["" if v is None else f"{v:.6g}" if isinstance(v, float) else v for v in r.values()])
    return f"# {FORMAT} v{VERSION}\n" + out.getvalue()


def read_results(path: Path | str) -> tuple[int, list[dict[str, str]]]:
    """(version, rows as strings) of a results.csv of any version this code reads."""
    try:
        text = read_capped(path, MAX_RAW).decode("utf-8", "replace")
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    version = 1
    if text.startswith("#"):
        head, _, text = text.partition("\n")
        if not head.startswith(f"# {FORMAT} v") or not head.rsplit("v", 1)[1].isdigit():
            raise UserError(f"{path}: not a {FORMAT} file (first line {head!r})")
        version = int(head.rsplit("v", 1)[1])
        if version > VERSION:
            raise UserError(f"{path}: {FORMAT} v{version} is newer than this bmoe-bench reads (v{VERSION}); "
                            f"upgrade bmoe")
    return version, list(csv.DictReader(io.StringIO(text)))
