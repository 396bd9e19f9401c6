"""What the model wrote: the text of each cell's first finished run, for a campaign that asks (`sample_text: N`),
taken from its engine.log's `BMOE_PROGRESS` lines (each carries its token's text delta). Reads at most 4 MiB of a
log (untrusted input: a bound, not a loop over whatever is there)."""

from __future__ import annotations

from harness.formats.folder import ENGINE_LOG, RUNS
from harness.formats.progress import parse_progress
from harness.report.collect import CampaignData

MAX_LOG_BYTES = 4 << 20
FENCE = "~~~~~~~~"


def run_text(data: CampaignData, run_id: str) -> str | None:
    p = data.folder / RUNS / run_id / ENGINE_LOG
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_LOG_BYTES)
    except OSError:
        return None
    parts = []
    for line in raw.decode("utf-8", "replace").splitlines():
        d = parse_progress(line)
        if d is not None and isinstance(d.get("text"), str):
            parts.append(d["text"])
    return "".join(parts) if parts else None


def sample_section(data: CampaignData) -> list[str]:
    n = getattr(data.plan, "sample_text", 0)
    if not n:
        return []
    L = ["## What the model wrote", "",
         f"Each cell's first finished run, its first {n} characters as the engine printed them (prompt: "
         f"{data.plan.prompt!r}; greedy decoding, warm-up tokens included).", ""]
    texts: dict[str, str] = {}
    for cell in data.cells:
        run = next((r for r in data.runs if r.rec.cell == cell.index and r.rec.status == "ok"), None)
        text = run_text(data, run.rec.run_id) if run else None
        if text is None:
            L += [f"**{cell.label}**: no finished run with its text.", ""]
            continue
        texts[cell.label] = text
        shown = "\n".join(ln for ln in text[:n].splitlines() if not ln.startswith("~~~"))
        L += [f"**{cell.label}** (run {run.rec.run_id}):", "", FENCE, shown, FENCE, ""]
    if len(texts) > 1:
        same = len(set(texts.values())) == 1
        L += [("Every cell's first run wrote the same text." if same else
               "The cells' first runs wrote different texts (see the audit above for which are lossless)."), ""]
    return L
