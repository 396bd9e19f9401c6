"""The lossless-output audit of a campaign (pure: CampaignData in, an Audit out).

A cell whose flags differ from its base cell only in knobs that cannot change the output (`lossless`)
must produce the base's token ids (the metrics CSV's `token_id` column) run by run: each of its runs is
compared with the base's run of the same round (the base's first good run when that one failed), and the
base's own runs with its first good run. A lossless cell that does not is a *violation*: the first line
of findings.md and a problem for `bmoe-bench check`. Any other cell (a lossy knob, or a setting that
defines the output such as the sampling temperature) shows its agreement with the base instead: the
share of identical tokens and the first divergence.

Which knobs are lossless comes from the engine's flag table (harness.engine.config: a flag declared
`lossy` is not), less the flags that define the output rather than how it is computed (`OUTPUT_SETTINGS`,
a test checks that every flag of the table is classified); for an external engine (its flags are
written in bmoe's vocabulary) from `EXTERNAL_LOSSLESS`, the flags the C++ original implements without
changing the output. On an engines axis every engine's cells compare with that engine's own base cell.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from harness.engine import SPECS
from harness.report.collect import CampaignData, RunData

# bmoe flags that are not declared lossy but choose the output itself (the model, the prompt, how much is
# generated, sampling, the chat template, the attention kernel and KV size, replayed routing, a drop's
# details): two runs that differ in one of them are not expected to agree, so they are compared, not audited.
# Everything else in the table without `lossy` changes only how the output is computed.
OUTPUT_SETTINGS = frozenset({
    "model", "prompt", "n_predict", "ctx", "flash_attn", "chatml", "no_think", "temp", "top_k", "top_p", "seed",
    "prompts_file", "session", "kv_reuse", "route_replay", "drop_no_renorm", "drop_in_prefill", "n_expert_used",
    "list_archs", "version",
})

# an external engine (the C++ original, `bmoe-cli`): the campaign flags, in bmoe's spelling, that it
# implements without changing the output (its README's knob table: streaming, the cache, read lanes,
# O_DIRECT, dense placement, --overlap ("byte-identical") and both prefetchers only move reads; it names
# --drop-cold-experts, --n-expert-used and --route-ahead lossy). Anything else is compared, not audited.
EXTERNAL_LOSSLESS = frozenset({
    "--moe-stream", "--cache-mb", "--cache-ceil-mb", "--force-cache", "--io-threads", "--no-odirect",
    "--dense-weights", "--overlap", "--prefetch", "--predict-prefetch", "--predict-spec-max",
})

_BY_FLAG = {f: s for s in SPECS for f in s.flag.flags}
Kind = Literal["lossless", "lossy", "setting", "unaudited"]


def bmoe_lossless(flag: str) -> bool:
    """A bmoe flag (any spelling) that cannot change the output."""
    s = _BY_FLAG.get(flag)
    return s is not None and not s.flag.lossy and s.name not in OUTPUT_SETTINGS


def classify(varied: dict[str, object], external: bool) -> tuple[Kind, list[str]]:
    """A cell's kind from the flags it varies against its base, and the flags that make it so (the lossy
    or output-setting ones; none for a lossless cell)."""
    flags = [f for f in varied if f != "engine"]
    if external:
        other = [f for f in flags if f not in EXTERNAL_LOSSLESS]
        return ("lossy" if other else "lossless"), other
    lossy = [f for f in flags if f in _BY_FLAG and _BY_FLAG[f].flag.lossy]
    if lossy:
        return "lossy", lossy
    other = [f for f in flags if not bmoe_lossless(f)]
    return ("setting" if other else "lossless"), other


@dataclass
class Pair:
    run_id: str
    base_run: str
    n: int  # tokens compared (the longer of the two sequences)
    same: int  # positions with the same token id
    first_diff: int | None  # the step (the CSV's step column, 1-based) of the first difference, or None
    turn: int | None = None  # the CSV's turn (0-based prompt) of that step, in a run that answers several

    @property
    def where(self) -> str:
        return f"step {self.first_diff}" + (f" of prompt {self.turn + 1}" if self.turn is not None else "")


@dataclass
class CellAudit:
    index: int
    label: str
    base: int  # the cell it is compared with
    kind: Kind
    why: list[str]  # the flags that make it lossy or a different setting; for unaudited, the reason
    pairs: list[Pair] = field(default_factory=list)

    @property
    def identical(self) -> float | None:
        n = sum(p.n for p in self.pairs)
        return sum(p.same for p in self.pairs) / n if n else None

    @property
    def first_diff(self) -> Pair | None:
        return next((p for p in self.pairs if p.first_diff is not None), None)

    @property
    def violations(self) -> list[Pair]:
        return [p for p in self.pairs if p.first_diff is not None] if self.kind == "lossless" else []


@dataclass
class Audit:
    cells: list[CellAudit]

    def headline(self) -> str | None:
        """findings.md's first line when a lossless cell's tokens differ from its base's, else None."""
        parts = [f"lossless cell '{c.label}' differs from its base '{self.cells[c.base].label}' in run "
                 + ", ".join(f"{p.run_id} from {p.where}" for p in c.violations)
                 for c in self.cells if c.violations]
        return f"**LOSSLESS AUDIT FAILED**: {'; '.join(parts)} (token ids; section *Output against the base*)." \
            if parts else None

    def violations(self) -> list[str]:
        """One line per lossless run whose tokens differ from its base run's."""
        return [f"lossless cell '{c.label}' run {p.run_id} differs from base run {p.base_run} at {p.where} "
                f"({p.same} of {p.n} token ids identical)" for c in self.cells for p in c.violations]


def _ids(r: RunData) -> list[tuple[int, int]] | None:
    """(turn, token id) per row, or None when the engine recorded no token ids."""
    m = r.metrics
    if m is None or "token_id" not in m.rows.columns:
        return None
    ids = m.token_ids()
    if any(t < 0 for t in ids):
        return None
    turns = m.col("turn")
    return [(int(turns[i]) if turns is not None else 0, t) for i, t in enumerate(ids)]


def compare(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> tuple[int, int, tuple[int, int] | None]:
    """Two runs' (turn, token id) rows, compared turn by turn (a run answering several prompts restarts its
    steps at each): (tokens compared, tokens equal, (turn, 1-based step) of the first difference or None).
    A turn one run ends early differs from the step after its last token."""
    ta: dict[int, list[int]] = {}
    tb: dict[int, list[int]] = {}
    for rows, out in ((a, ta), (b, tb)):
        for t, tok in rows:
            out.setdefault(t, []).append(tok)
    n = same = 0
    first = None
    for t in sorted(set(ta) | set(tb)):
        x, y = ta.get(t, []), tb.get(t, [])
        m = max(len(x), len(y))
        n += m
        same += sum(1 for u, v in zip(x, y, strict=False) if u == v)
        if first is None:
            i = next((i for i in range(m) if i >= len(x) or i >= len(y) or x[i] != y[i]), None)
            first = None if i is None else (t, i + 1)
    return n, same, first


def _base_of(data: CampaignData, i: int) -> int:
    """The cell a cell is compared with: the base cell, or on an engines axis its own engine's base."""
    cell = data.cells[i]
    base = next((c.index for c in data.cells if not c.varied), 0)  # the reference engine's base on an axis
    if data.plan.engines and cell.engine is not None:
        return next(c.index for c in data.cells if c.engine == cell.engine and c.setting == base)
    return base


def _varied(data: CampaignData, i: int, base: int) -> dict[str, object]:
    a, b = data.cells[i].flags, data.cells[base].flags
    return {k: a.get(k) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def _external(data: CampaignData, i: int) -> bool:
    c = data.cells[i]
    if data.plan.engines and c.engine is not None:
        return data.plan.engines[c.engine].kind != "bmoe"
    return data.plan.engine.kind != "bmoe"


def audit(data: CampaignData) -> Audit:
    out = []
    for cell in data.cells:
        base = _base_of(data, cell.index)
        kind, why = classify(_varied(data, cell.index, base), _external(data, cell.index))
        ca = CellAudit(cell.index, cell.label, base, kind, why)
        out.append(ca)
        base_ok = [r for r in data.cell_runs(base) if r.ok]
        if not base_ok:
            ca.kind, ca.why = "unaudited", ["no good run of the base cell"]
            continue
        by_round = {r.rec.round: r for r in base_ok}
        for r in data.cell_runs(cell.index):
            if not r.ok:
                continue
            ref = base_ok[0] if cell.index == base else by_round.get(r.rec.round, base_ok[0])
            if ref is r:
                continue
            a, b = _ids(r), _ids(ref)
            if a is None or b is None:
                ca.kind, ca.why, ca.pairs = "unaudited", ["no token_id column: the engine records no token ids"], []
                break
            n, same, first = compare(b, a)
            multi = len({t for t, _ in a} | {t for t, _ in b}) > 1
            ca.pairs.append(Pair(r.run_id, ref.run_id, n, same, first[1] if first else None,
                                 first[0] if first and multi else None))
    return Audit(out)


def _share(c: CellAudit) -> str:
    s = c.identical
    return "n/a" if s is None else f"{100 * s:.1f}%"


def audit_section(a: Audit) -> list[str]:
    """findings.md's section: every cell's token ids against its base, lossless cells audited."""
    whys = {tuple(c.why) for c in a.cells if c.kind == "unaudited"}
    if a.cells and all(c.kind == "unaudited" for c in a.cells) and len(whys) == 1:
        return ["## Output against the base", "", f"Not audited: {a.cells[0].why[0]}.", ""]
    L = ["## Output against the base", "",
         "Token ids (`token_id`) of every run against its base cell's run of the same round (the base's own "
         "runs against its first). A *lossless* cell differs from its base only in knobs that cannot change "
         "the output (the engine's flag table) and must match token for token; a *lossy* cell or one with "
         "another *setting* shows how far it agrees.", "",
         "| cell | vs | kind | runs compared | identical token ids | first divergence |", "|---|---|---|---|---|---|"]
    for c in a.cells:
        kind = c.kind + (f" ({', '.join(c.why)})" if c.why else "")
        d = c.first_diff
        first = "none" if d is None else f"{d.run_id} at {d.where}"
        if c.kind == "unaudited" or not c.pairs:
            first = "n/a"
        verdict = " **VIOLATION**" if c.violations else ""
        L.append(f"| {c.label} | {a.cells[c.base].label} | {kind}{verdict} | {len(c.pairs)} | {_share(c)} | "
                 f"{first} |")
    return L + [""]
