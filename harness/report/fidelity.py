"""A fidelity campaign's figures in its report: per scored cell the mean KLD against the campaign's reference with
a 95% t interval over chunks (harness.kld.chunk_interval), its p99, the same-top share and the cell's decode speed
ratio to the base, read from each scored cell's first-round fidelity.csv; the findings' section and the data of
the speed-against-KLD plot (harness.report.plots)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from harness import kld
from harness.errors import UserError
from harness.formats.fidelity import read_fidelity_csv
from harness.formats.folder import FIDELITY_CSV, FIDELITY_REF, RUNS
from harness.report.collect import CampaignData
from harness.report.intervals import fmt
from harness.report.results import CellResult, Results

PLOT = "kld.png"


@dataclass(frozen=True)
class CellFidelity:
    index: int
    label: str
    run_id: str
    positions: int
    kld: kld.ChunkInterval
    p99: float
    same_top_pct: float
    drop_in_prefill_added: bool

    @property
    def lossless(self) -> bool:
        return self.kld.mean == 0 and self.p99 == 0 and self.same_top_pct == 100


def cell_fidelity(data: CampaignData) -> list[CellFidelity] | None:
    """The scored cells' figures (a cell whose scoring did not run or failed is left out), or None when the
    campaign has no fidelity section."""
    rec = data.plan.fidelity
    if rec is None:
        return None
    out = []
    for i in rec.scored:
        run = next((r for r in data.cell_runs(i) if r.rec.round == 0 and r.ok), None)
        p = data.folder / RUNS / run.run_id / FIDELITY_CSV if run is not None else None
        if p is None or not p.is_file():
            continue
        try:
            cols = read_fidelity_csv(p).columns
        except UserError:
            continue
        if not len(cols["kld"]):
            continue
        srt = np.sort(cols["kld"])
        out.append(CellFidelity(i, data.cells[i].label, run.run_id, len(srt), kld.chunk_interval(cols["kld"],
                                                                                                 cols["chunk"]),
                                kld.percentile(srt, 0.99), 100 * float(cols["same_top"].mean()),
                                i in rec.drop_in_prefill_added))
    return out


def _g(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.4g}"


def kld_text(f: CellFidelity) -> str:
    """`0.0482 [0.0401, 0.0563]`: the mean KLD and its 95% interval over chunks (none below two chunks)."""
    iv = f.kld
    return _g(iv.mean) if not math.isfinite(iv.low) else f"{_g(iv.mean)} [{_g(iv.low)}, {_g(iv.high)}]"


def _covered(data: CampaignData) -> list[str]:
    """How much probability the reference's top K keep (harness.kld.covered), from the committed reference."""
    from harness.formats.fidelity import read_ref

    p = data.folder / FIDELITY_REF
    if not p.is_file():
        return []
    try:
        ref = read_ref(p)
    except UserError:
        return []
    if not len(ref.rows):
        return []
    mean, least = kld.covered(ref.rows["tail_lp"])
    return [f"The reference's top {ref.header['top_k']} tokens per position keep {100 * mean:.4g}% of its probability "
            f"on average, {100 * least:.4g}% at least: every KLD above is over those tokens and the rest as one "
            "outcome" + (", exact where they keep everything." if least >= 0.99 else
                         ", a lower bound of the full KLD where they keep little."), ""]


def fidelity_section(data: CampaignData, res: Results, cells: list[CellFidelity]) -> list[str]:
    rec = data.plan.fidelity
    assert rec is not None
    by = {c.index: c for c in res.cells}
    text = f"`{rec.text_file}`" if rec.text_file else "the campaign's inline text"
    L = ["## Fidelity: what each knob costs per token", "",
         f"Every scored cell evaluated {text} ({rec.text_chars} characters, sha256 {rec.text_sha256[:12]}…) "
         f"teacher-forced in chunks of {rec.ctx} tokens (llama-perplexity's `--kl-divergence` layout"
         + ("; each chunk decoded one token at a time, `--fidelity-decode`, so decode-time knobs act as in "
            "generation" if getattr(rec, "decode", False) else "") + "), against "
         "one reference made once for the campaign with the base cell's flags"
         + (f" plus {rec.flags}" if rec.flags else "") + f" (`{FIDELITY_REF}`, top {rec.top_k or 'all'} "
         "log-probabilities per position). KLD(ref||cell) in nats; its interval is 95% over chunks: each chunk's "
         "mean KLD is one observation and the interval is mean ± t(0.975, chunks−1) × (standard deviation of the "
         "chunk means) / √chunks, its low end clipped at 0 (a KLD is never negative). Positions within a chunk "
         "share its context and are not independent, so no interval is taken over positions. p99 is over all "
         "scored positions; same-top is the share of positions "
         "whose most probable token is the reference's; the speed ratio is the cell's decode tok/s over the "
         "base's, with the interval the Results table uses.", ""]
    if data.manifest.model.recipe:
        L += ["**The model is synthetic, with random weights**: these divergences are computed exactly as for a "
              "trained model, but their absolute values are meaningless (a random model has no language to lose); "
              "what this folder shows is the pipeline end to end"
              + (", the lossless cells' exact 0" if any(f.lossless for f in cells) else "")
              + f" and the ordering of the lossy cells on this model. The same campaign on a real model: "
              f"`{data.manifest.reproduce} --set "
              f"model.path=/path/to/model.gguf`.", ""]
    if not cells:
        return L + ["No scored cell has figures (their scoring failed or has not run).", ""]
    L += ["| cell | mean KLD [95% over chunks] | KLD p99 | same top % | positions (chunks) | speed ratio to base |",
          "|---|---|---|---|---|---|"]
    for f in cells:
        c: CellResult | None = by.get(f.index)
        ratio = "1 (base)" if c is not None and not c.varied else fmt(c.ratio if c else None, 3, "x")
        mark = " ¹" if f.drop_in_prefill_added else ""
        L.append(f"| {f.label}{mark} | {kld_text(f)} | {_g(f.p99)} | {f.same_top_pct:.2f} | {f.positions} "
                 f"({f.kld.n_chunks}) | {ratio} |")
    L.append("")
    if any(f.drop_in_prefill_added for f in cells):
        L += ["¹ scored with `--drop-in-prefill` added (scoring is all prefill, where a drop rule otherwise drops "
              "nothing); its speed runs dropped in decode only.", ""]
    L += _covered(data)
    zero = [f.label for f in cells if f.lossless]
    if zero:
        L += [f"KLD exactly 0 and 100% same top: {', '.join(zero)}.", ""]
    missing = [data.cells[i].label for i in rec.scored if i not in {f.index for f in cells}]
    if missing:
        L += [f"Not scored (the scoring failed or has not run): {', '.join(missing)}.", ""]
    L += [f"![decode tok/s against mean KLD](plots/{PLOT})", ""]
    return L
