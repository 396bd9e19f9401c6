"""A fidelity campaign's held-out quality (its records are bmoe_fidelity v2: the next token's log-probability and
whether the argmax hit it, per scored position): perplexity, next-token accuracy and each cell against the
reference (the base cell's flags) on the same positions, regraded from the committed records alone
(harness.quality.heldout has the statistics). `bmoe-bench grade DIR` prints them; findings.md has the section."""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.errors import UserError
from harness.formats.fidelity import read_fidelity_csv
from harness.formats.folder import FIDELITY_CSV, RUNS
from harness.quality.heldout import ChunkMean, HeldOut, Paired, heldout, paired
from harness.quality.stats import min_discordant_for
from harness.report.collect import CampaignData

BASE = "reference (the base cell's flags)"


@dataclass(frozen=True)
class CellHeldOut:
    label: str
    run_id: str
    figures: HeldOut
    vs_base: Paired | None  # None: the reference's own row
    kld_mean: float
    same_top_pct: float


def cell_heldout(data: CampaignData) -> list[CellHeldOut] | None:
    """The reference's row (from any scored record's reference columns) and every scored cell's, or None when the
    campaign has no fidelity section or its records predate the v2 columns. Records of other positions than the
    first one's are refused (the reference is one file: every record scores its positions)."""
    rec = data.plan.fidelity
    if rec is None:
        return None
    out: list[CellHeldOut] = []
    key = None
    for i in rec.scored:
        run = next((r for r in data.cell_runs(i) if r.rec.round == 0 and r.ok), None)
        p = data.folder / RUNS / run.run_id / FIDELITY_CSV if run is not None else None
        if p is None or not p.is_file():
            continue
        c = read_fidelity_csv(p).columns
        if "lp_run" not in c or not len(c["kld"]):
            return None
        here = (c["chunk"].tolist(), c["pos"].tolist(), c["token"].tolist())
        if key is None:
            key = here
            ref_hit = c["ref_top"] == c["token"]
            out.append(CellHeldOut(BASE, "", heldout(c["lp_ref"], ref_hit, c["chunk"]), None, 0.0, 100.0))
        elif here != key:
            raise UserError(f"{p}: its positions are not the other records' (another reference?); restore the "
                            "folder's committed files or rerun the campaign")
        ref_hit = c["ref_top"] == c["token"]
        out.append(CellHeldOut(data.cells[i].label, run.run_id, heldout(c["lp_run"], c["hit"], c["chunk"]),
                               paired(c["lp_ref"], ref_hit, c["lp_run"], c["hit"], c["chunk"]),
                               float(c["kld"].mean()), 100 * float(c["same_top"].mean())))
    return out or None


def _g(x: float, digits: int = 4) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.{digits}g}"


def _iv(m: ChunkMean, scale: float = 1.0, digits: int = 4) -> str:
    pt = _g(scale * m.mean, digits)
    return pt if not m.has_interval else f"{pt} [{_g(scale * m.low, digits)}, {_g(scale * m.high, digits)}]"


def _sgn(m: ChunkMean) -> str:
    if not m.has_interval:
        return f"{m.mean:+.4g}"
    return f"{m.mean:+.4g} [{m.low:+.4g}, {m.high:+.4g}]"


def lines(cells: list[CellHeldOut]) -> list[str]:
    """One line per row: `label: perplexity X [lo, hi], accuracy k/n = a% [CP lo, hi], vs base ...`."""
    out = []
    for x in cells:
        f = x.figures
        a = f.acc
        s = (f"{x.label}: perplexity {_iv(f.ppl)}, next-token accuracy {a.correct}/{a.n} = {100 * a.point:.2f}% "
             f"[{100 * a.low:.2f}, {100 * a.high:.2f}]")
        if x.vs_base is not None:
            mc = x.vs_base.mcnemar
            s += (f"; vs reference: mean log-prob {_sgn(x.vs_base.dlp)} nats, McNemar exact p={mc.p:.3g} "
                  f"({mc.only_base} hit by the reference only, {mc.only_cell} by the cell only), "
                  f"KLD {_g(x.kld_mean)}, same top {x.same_top_pct:.2f}%")
        out.append(s)
    return out


def heldout_section(data: CampaignData, cells: list[CellHeldOut]) -> list[str]:
    rec = data.plan.fidelity
    assert rec is not None
    how = ("one token at a time (`--fidelity-decode`: every decode-time knob acts as in generation)"
           if getattr(rec, "decode", False) else "in one prompt batch per chunk (llama-perplexity's layout)")
    f0 = cells[0].figures
    L = ["## Held-out quality: perplexity and next-token accuracy", "",
         f"Regraded from the committed per-position records (`runs/<id>/{FIDELITY_CSV}`, bmoe_fidelity v2) alone: "
         f"{f0.positions} positions in {f0.ppl.n_chunks} chunks of {rec.ctx} tokens, scored {how}. Perplexity is "
         "exp(−mean log-probability of the next token), its interval 95% over chunks (a t interval of the chunk "
         "means of the log-probability, through exp). Accuracy is the share of positions whose most probable token "
         "is the text's next, with its exact Clopper-Pearson 95% interval over positions and, beside it, the 95% "
         "t interval over chunks; positions in a chunk share its context, so the exact interval assumes more "
         "independence than the text has: where the two differ, the interval over chunks is the one to read. "
         "Each cell is paired with the reference on the same positions: the mean log-probability difference "
         "(cell − reference, nats; negative = the text is less likely under the cell) with a paired 95% t interval "
         "over chunks, and the exact McNemar test on the per-position hits (the same caveat: its positions are "
         "not independent pairs).", "",
         "| cell | perplexity [95% over chunks] | accuracy % [Clopper-Pearson 95%] | accuracy % [95% over chunks] | "
         "Δ mean log-prob vs reference [95% over chunks] | McNemar: reference only / cell only, exact p | "
         "mean KLD | same top % |",
         "|---|---|---|---|---|---|---|---|"]
    for x in cells:
        f, a = x.figures, x.figures.acc
        acc = f"{100 * a.point:.2f} [{100 * a.low:.2f}, {100 * a.high:.2f}]"
        if x.vs_base is None:
            vs = "— | — | — | —"
        else:
            mc = x.vs_base.mcnemar
            vs = (f"{_sgn(x.vs_base.dlp)} | {mc.only_base} / {mc.only_cell}, p={mc.p:.3g} | {_g(x.kld_mean)} | "
                  f"{x.same_top_pct:.2f}")
        L.append(f"| {x.label} | {_iv(f.ppl)} | {acc} | {_iv(f.acc_chunks, 100, 4)} | {vs} |")
    L.append("")
    m = min_discordant_for()
    L += [f"An exact McNemar test needs at least {m} discordant positions, all one way, to reach p < 0.05; a cell "
          "with fewer cannot differ significantly from the reference on hits, whatever its true effect.", ""]
    if any(x.vs_base is not None and x.vs_base.dlp.has_interval and x.vs_base.dlp.high < 0 for x in cells):
        worse = [x.label for x in cells if x.vs_base is not None and x.vs_base.dlp.has_interval
                 and x.vs_base.dlp.high < 0]
        L += [f"The text is less likely than under the reference (the whole interval below 0): {', '.join(worse)}.",
              ""]
    return L


def regrade_lines(data: CampaignData) -> list[str] | None:
    cells = cell_heldout(data)
    return None if cells is None else lines(cells)

