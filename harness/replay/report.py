"""Replay grids and their renderings: CSV text, a rich table, curve plots, findings.md. Pure except
`plot_curves` (writes a PNG) and `render_table` (returns a rich Table the CLI prints)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

from harness.engine import POLICIES, is_offline
from harness.errors import UserError
from harness.replay.bounds import BOUNDS, Usage, make_bound
from harness.replay.simulate import MIB, ReplayResult, replay
from harness.replay.trace import RouteTrace

CSV_COLUMNS = ["trace", "policy", "budget_mib", "hit_pct", "mib_per_token"]
KEY_BUDGETS_MIB = [2000, 3000, 4000]  # the budgets the gap-closing goal is judged at


def parse_policies(text: str) -> list[str]:
    """`all` (every cache policy) or a comma list of registered names, informed bounds (told-*,
    harness/replay/bounds.py) included; unknown names are a UserError."""
    if text.strip() == "all":
        return list(POLICIES)
    names = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES and p not in BOUNDS]
    if unknown or not names:
        raise UserError(f"--policies {text!r}: unknown policy {', '.join(unknown) or '(none given)'}; "
                        f"known: {', '.join(POLICIES)}, or all; informed bounds: {', '.join(BOUNDS)}")
    return list(dict.fromkeys(names))


def offline(name: str) -> bool:
    """Needs the trace's future: belady and the informed bounds."""
    return name in BOUNDS or is_offline(name)


def parse_budgets(text: str) -> list[int]:
    """Comma list of budgets in MiB (integers >= 0)."""
    try:
        budgets = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        budgets = []
    if not budgets or any(b < 0 for b in budgets):
        raise UserError(f"--budgets {text!r}: give a comma list of budgets in MiB, e.g. 500,1000,2000")
    return sorted(set(budgets))


def fine_grid(trace: RouteTrace, steps: int = 40) -> list[int]:
    """Budgets (MiB) from a quarter of T to 10% above the working set, geometric, plus T itself and
    the goal's budgets: the scan behind the 'never loses to LRU' check."""
    lo = max(50.0, trace.cycle_bytes / MIB / 4)
    hi = trace.working_set_bytes / MIB * 1.1
    ratio = (hi / lo) ** (1 / (steps - 1))
    grid = {round(lo * ratio**i / 10) * 10 for i in range(steps)}
    grid |= {round(trace.cycle_bytes / MIB), *KEY_BUDGETS_MIB, 500, 1000}
    return sorted(b for b in grid if b > 0)


def run_grid(traces: Sequence[RouteTrace], policies: Sequence[str],
             budgets: dict[str, list[int]] | list[int]) -> list[ReplayResult]:
    out = []
    for t in traces:
        usage = Usage(t) if any(p in BOUNDS for p in policies) else None
        for b in budgets[t.name] if isinstance(budgets, dict) else budgets:
            for p in policies:
                out.append(replay(t, make_bound(p, t, usage) if p in BOUNDS else p, b * MIB))
    return out


def to_csv(results: Sequence[ReplayResult]) -> str:
    buf = io.StringIO()
    buf.write(",".join(CSV_COLUMNS) + "\n")
    for r in results:
        buf.write(f"{r.trace},{r.policy},{r.budget_mib:g},{r.hit_pct:.3f},{r.mib_per_token:.3f}\n")
    return buf.getvalue()


def render_table(results: Sequence[ReplayResult], traces: Sequence[RouteTrace]):
    from rich.table import Table

    cycle = {t.name: t.cycle_bytes / MIB for t in traces}
    table = Table(title="expert-cache replay (hit % cumulative over prefill+decode, as the engine reports)")
    for col in ("trace", "T MiB", "policy", "budget MiB", "hit %", "MiB/token"):
        table.add_column(col, justify="left" if col in ("trace", "policy") else "right")
    for r in results:
        table.add_row(r.trace, f"{cycle[r.trace]:.0f}", r.policy + (" (offline)" if offline(r.policy) else ""),
                      f"{r.budget_mib:g}", f"{r.hit_pct:.2f}", f"{r.mib_per_token:.1f}")
    return table


def plot_curves(results: Sequence[ReplayResult], traces: Sequence[RouteTrace], path: str) -> None:
    """Hit % against budget, one panel per trace, one line per policy, T and the working set marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(traces), figsize=(6.5 * len(traces), 4.8), squeeze=False)
    for ax, t in zip(axes[0], traces, strict=True):
        rs = [r for r in results if r.trace == t.name]
        for pol in dict.fromkeys(r.policy for r in rs):
            pts = sorted((r.budget_mib, r.hit_pct) for r in rs if r.policy == pol)
            style = ("k--" if pol == "belady" else ":") if offline(pol) else "-"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker=".", ms=3, lw=1.2, label=pol)
        ax.axvline(t.cycle_bytes / MIB, color="red", lw=0.8, ls=":")
        xt = ax.get_xaxis_transform()  # x in data, y in axes fraction
        ax.text(t.cycle_bytes / MIB, 0.02, f" T={t.cycle_bytes / MIB:.0f} MiB", color="red", fontsize=8,
                transform=xt)
        ax.axvline(t.working_set_bytes / MIB, color="grey", lw=0.8, ls=":")
        ax.text(t.working_set_bytes / MIB, 0.02, "working set ", color="grey", fontsize=8, ha="right",
                transform=xt)
        ax.set_xscale("log")
        ax.set_xlabel("cache budget (MiB, log scale)")
        ax.set_ylabel("hit % (prefill + decode lookups)")
        ax.set_title(f"{t.name}: {t.arch}, {t.n_layer} layers, top-{t.k}, "
                     f"{t.prefill_tokens}+{t.decode_tokens} tokens", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@dataclass(frozen=True)
class Comparison:
    """One policy against LRU and Belady at one budget of one trace."""

    trace: str
    budget_mib: float
    lru: float
    belady: float
    policy: float

    @property
    def gap_closed(self) -> float:
        """Fraction of the LRU->Belady gap closed (nan when there is no gap)."""
        gap = self.belady - self.lru
        return (self.policy - self.lru) / gap if gap > 1e-9 else float("nan")


def compare(results: Sequence[ReplayResult], policy: str) -> list[Comparison]:
    idx = {(r.trace, r.policy, r.budget_bytes): r.hit_pct for r in results}
    out = []
    for (tr, pol, b), v in idx.items():
        if pol == policy and (tr, "lru", b) in idx and (tr, "belady", b) in idx:
            out.append(Comparison(tr, b / MIB, idx[(tr, "lru", b)], idx[(tr, "belady", b)], v))
    return sorted(out, key=lambda c: (c.trace, c.budget_mib))
