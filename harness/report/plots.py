"""The report's plots as PNG bytes (matplotlib Agg, no timestamps in the metadata): tok/s per cell with
CIs and each run's value, the per-token time series of every run, and the stacked s/token split; a fidelity
campaign's speed against KLD."""

from __future__ import annotations

import io
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from harness.report.collect import CampaignData  # noqa: E402
from harness.report.fidelity import PLOT as KLD_PLOT  # noqa: E402
from harness.report.fidelity import CellFidelity  # noqa: E402
from harness.report.results import Results  # noqa: E402
from harness.report.traced import timeline_plot  # noqa: E402


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def _fin(x: float) -> float:
    return x if math.isfinite(x) else 0.0


def tok_s_plot(res: Results) -> bytes:
    cells = [c for c in res.cells if c.tok_s is not None]
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(cells) + 2), 3.6))
    xs = range(len(cells))
    pts = [c.tok_s.point for c in cells]
    ivs = [c.tok_s if c.tok_s.between_runs else None for c in cells]  # one run: no interval between runs
    err = [[iv.point - iv.low if iv else 0.0 for iv in ivs], [iv.high - iv.point if iv else 0.0 for iv in ivs]]
    ax.bar(xs, pts, color=["#888" if not c.varied else "#4a7fb5" for c in cells], alpha=0.7)
    ax.errorbar(xs, pts, yerr=err, fmt="none", ecolor="black", capsize=4)
    for i, c in enumerate(cells):
        ax.plot([i] * len(c.run_rates), c.run_rates, "o", color="black", ms=3)
    ax.set_xticks(list(xs), [c.label for c in cells], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("tok/s (95% interval over runs; dots = runs)")
    fig.tight_layout()
    return _png(fig)


def split_plot(res: Results) -> bytes:
    cells = [c for c in res.cells if c.tok_s is not None]
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(cells) + 2), 3.6))
    xs = list(range(len(cells)))
    io_ = [_fin(c.io_s) for c in cells]
    mg = [_fin(c.mgmt_s) for c in cells]
    cp = [_fin(c.compute_s) for c in cells]
    ax.bar(xs, io_, label="I/O wait (stall)", color="#d9822b")
    ax.bar(xs, mg, bottom=io_, label="cache mgmt", color="#7a9a01")
    ax.bar(xs, cp, bottom=[a + b for a, b in zip(io_, mg, strict=True)], label="compute (residual)",
           color="#4a7fb5")
    unsplit = [c.wall_s if not any(math.isfinite(v) for v in (c.io_s, c.mgmt_s, c.compute_s)) else 0.0
               for c in cells]
    if any(unsplit):
        ax.bar(xs, unsplit, label="wall (split not measured)", color="#ccc", hatch="//", edgecolor="#888")
    ax.set_xticks(xs, [c.label for c in cells], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("s/token")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _png(fig)


def tokens_plot(data: CampaignData, res: Results) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 3.6))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    labels = {c.index: c.label for c in data.cells}
    shown: set[int] = set()
    for r in sorted(data.runs, key=lambda r: r.rec.position):
        if not r.ok:
            continue
        ci = r.rec.cell
        w = r.metrics.wall_ms(0)
        ax.plot(range(1, len(w) + 1), w, color=colors[ci % len(colors)], lw=0.8, alpha=0.8,
                label=labels[ci] if ci not in shown else None)
        shown.add(ci)
    if data.warmup:
        ax.axvspan(0.5, data.warmup + 0.5, color="#ddd", label=f"warm-up ({data.warmup}, trimmed)")
    ax.set_xlabel("token")
    ax.set_ylabel("wall ms/token")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return _png(fig)


def kld_plot(cells: list[CellFidelity], res: Results) -> bytes:
    """Decode tok/s (95% interval over runs) against mean KLD (95% interval over chunks), one point per scored
    cell: the trade-off a user chooses on. Symmetric-log x axis, so the lossless cells' exact 0 is shown."""
    by = {c.index: c for c in res.cells}
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for f in cells:
        c = by.get(f.index)
        if c is None or c.tok_s is None:
            continue
        iv, t = f.kld, c.tok_s
        xerr = [[iv.mean - iv.low], [iv.high - iv.mean]] if math.isfinite(iv.low) else None
        yerr = [[t.point - t.low], [t.high - t.point]] if t.between_runs else None
        ax.errorbar([iv.mean], [t.point], xerr=xerr, yerr=yerr, fmt="o", color="#888" if not c.varied else
                    "#4a7fb5", ecolor="black", capsize=3, ms=5)
        ax.annotate(f.label, (iv.mean, t.point), textcoords="offset points", xytext=(5, 4), fontsize=7)
    small = min([f.kld.mean for f in cells if f.kld.mean > 0] or [1e-3])
    ax.set_xscale("symlog", linthresh=small / 2)
    ax.set_xlabel("mean KLD vs the reference, nats (95% interval over chunks)")
    ax.set_ylabel("decode tok/s (95% interval over runs)")
    fig.tight_layout()
    return _png(fig)


def all_plots(data: CampaignData, res: Results, fidelity: list[CellFidelity] | None = None) -> dict[str, bytes]:
    return {"tok_s.png": tok_s_plot(res), "split.png": split_plot(res), "tokens.png": tokens_plot(data, res),
            **timeline_plot(data), **({KLD_PLOT: kld_plot(fidelity, res)} if fidelity else {})}
