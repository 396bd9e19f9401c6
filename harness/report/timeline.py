"""One token's timeline from a run's io_trace and compute_trace (harness.formats.traces): the compute thread's
intervals (ggml computing, coloured by layer span; waits on reads; the hook's own Python) above one row per
read lane (a bar from a read's start to its end: demand and speculative coloured apart, wasted hatched; a thin
line from when it was issued to when a lane took it). Pure: traces in, PNG bytes out."""

from __future__ import annotations

import io
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from harness.errors import UserError  # noqa: E402
from harness.formats.traces import UNFILLED, Interval, ReadRow, TraceFile  # noqa: E402

DECODE = 1
_LAYER_COLORS = ("#4a7fb5", "#86b0d8")
_STATE_COLORS = {"wait": "#c0392b", "hook": "#999999"}
_KIND_COLORS = {"demand": "#2e8b57", "speculative": "#d9822b"}


@dataclass
class TokenView:
    """What happened during one token: its step, the window (ns), the compute intervals and the reads."""

    step: int
    start_ns: int
    end_ns: int
    intervals: list[Interval]
    reads: list[ReadRow]
    io_threads: int

    @property
    def wall_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def decode_steps(compute: TraceFile) -> list[int]:
    return sorted({r.step for r in compute.rows if r.phase == DECODE})


def median_step(compute: TraceFile, skip: int = 0) -> int:
    """The decode token whose wall time (its intervals' extent) is the median, after `skip` warm-up tokens."""
    spans: dict[int, list[int]] = {}
    for r in compute.rows:
        if r.phase == DECODE:
            s = spans.setdefault(r.step, [r.start_ns, r.end_ns])
            s[0], s[1] = min(s[0], r.start_ns), max(s[1], r.end_ns)
    steps = sorted(spans)
    if not steps:
        raise UserError("the compute trace has no decode token")
    kept = steps[skip:] or steps
    by_wall = sorted(kept, key=lambda s: (spans[s][1] - spans[s][0], s))
    return by_wall[(len(by_wall) - 1) // 2]


def token_view(io_tr: TraceFile, compute: TraceFile, step: int) -> TokenView:
    iv = [r for r in compute.rows if r.phase == DECODE and r.step == step]
    if not iv:
        have = decode_steps(compute)
        raise UserError(f"token {step} is not in the compute trace (it has decode tokens "
                        f"{have[0] if have else '-'}..{have[-1] if have else '-'})")
    a, b = min(r.start_ns for r in iv), max(r.end_ns for r in iv)
    reads = [r for r in io_tr.rows if r.started_ns != UNFILLED and r.finished_ns >= a and r.started_ns <= b
             or r.phase == DECODE and r.step == step]
    lanes = int(io_tr.meta.get("io_threads", 0) or 0) or (max((r.lane for r in reads), default=0) + 1)
    return TokenView(step, a, b, iv, reads, lanes)


def timeline_png(v: TokenView, title: str = "") -> bytes:
    ms = 1e6
    t0 = v.start_ns
    n = v.io_threads
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.45 * (n + 1)))
    y_cpu = n  # the compute thread on top, lanes 0..n-1 below it
    layers = sorted({r.layer for r in v.intervals})
    first = {}
    for r in v.intervals:
        first.setdefault(r.layer, r.start_ns)
        color = _LAYER_COLORS[layers.index(r.layer) % 2] if r.state == "compute" else _STATE_COLORS[r.state]
        ax.broken_barh([((r.start_ns - t0) / ms, (r.end_ns - r.start_ns) / ms)], (y_cpu - 0.4, 0.8),
                       facecolors=color, linewidth=0)
    for layer, s in first.items():
        ax.axvline((s - t0) / ms, color="#bbb", lw=0.5, zorder=0)
        ax.text((s - t0) / ms, y_cpu + 0.45, str(layer), fontsize=6, va="bottom", ha="left", color="#555")
    for r in v.reads:
        y = r.lane if r.lane != UNFILLED else -1
        if r.issued_ns < r.started_ns:
            ax.plot([(r.issued_ns - t0) / ms, (r.started_ns - t0) / ms], [y, y], color="#ccc", lw=0.6, zorder=1)
        ax.broken_barh([((r.started_ns - t0) / ms, (r.finished_ns - r.started_ns) / ms)], (y - 0.35, 0.7),
                       facecolors=_KIND_COLORS.get(r.kind, "#555"), edgecolor="white", linewidth=0.3,
                       hatch="////" if r.outcome == "wasted" else None, zorder=2)
    ax.set_yticks(list(range(n + 1)), [f"lane {i}" for i in range(n)] + ["compute thread"], fontsize=8)
    ax.set_xlim(min(0.0, min(((r.issued_ns - t0) / ms for r in v.reads), default=0.0)), v.wall_ms)
    ax.set_ylim(-0.7, n + 1.0)
    ax.set_xlabel(f"ms from the decode call of token {v.step} (layer spans numbered on top)")
    mib = sum(r.bytes for r in v.reads if r.phase == DECODE and r.step == v.step) / 2**20
    ax.set_title(title or f"token {v.step}: {v.wall_ms:.1f} ms, {len(v.reads)} reads, {mib:.2f} MiB", fontsize=9)
    legend = [Patch(color=_LAYER_COLORS[0], label="compute (layer span)"),
              Patch(color=_STATE_COLORS["wait"], label="wait on reads"),
              Patch(color=_STATE_COLORS["hook"], label="hook (Python)"),
              Patch(color=_KIND_COLORS["demand"], label="demand read"),
              Patch(color=_KIND_COLORS["speculative"], label="speculative read"),
              Patch(facecolor="white", edgecolor="#555", hatch="////", label="wasted")]
    ax.legend(handles=legend, fontsize=7, ncol=6, loc="upper center", bbox_to_anchor=(0.5, -0.28 - 0.3 / (n + 1)),
              frameon=False)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()
