"""Pure expansion of a campaign into cells (one flag varied at a time, or a cross when asked for) and
into an ordered list of runs."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from harness.campaigns.schema import Campaign
from harness.campaigns.yamlsrc import CampaignError, Where, where_order
from harness.formats.campaign import FlagValue, render_value
from harness.formats.manifest import run_id as make_run_id


@dataclass(frozen=True)
class Cell:
    index: int
    flags: dict[str, FlagValue]  # the full engine flags of this cell (base + its change)
    varied: dict[str, FlagValue]  # what differs from the base cell (empty for the base)
    line: Where  # the source line (or --set argument) that produced it
    name: str = ""  # the axis value's label; "" -> derived from what varies
    engine: str = ""  # its engine's label on the engines axis; "" with one engine
    setting: int = -1  # engines axis: the index of the same flags' cell of the reference engine (-1: none)
    device: str = ""  # a compare fleet: its device's label (harness.campaigns.fleet.devices); "" otherwise

    @property
    def label(self) -> str:
        return self.name or cell_label(self.varied)

    @property
    def is_base(self) -> bool:
        return not self.varied


@dataclass(frozen=True)
class RunSpec:
    run_id: str
    round: int  # 0-based repeat round
    cell: int  # Cell.index
    position: int  # 0-based place in the campaign's run order


def _absent(v: FlagValue) -> bool:
    return v is None or v is False


def same_value(a: FlagValue, b: FlagValue) -> bool:
    if _absent(a) and _absent(b):
        return True
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b and type(a) is type(b) or str(a) == str(b)


def cell_label(varied: dict[str, FlagValue]) -> str:
    if not varied:
        return "base"
    return " ".join(f"{k}={render_value(v)}" for k, v in varied.items())


def flags_argv(flags: dict[str, FlagValue]) -> list[str]:
    """Engine argv for a flag mapping: true -> bare flag, false/null -> omitted, else flag value."""
    out: list[str] = []
    for k, v in flags.items():
        if v is True:
            out.append(k)
        elif _absent(v):
            continue
        else:
            out += [k, str(v)]
    return out


def _diff(base: dict[str, FlagValue], flags: dict[str, FlagValue]) -> dict[str, FlagValue]:
    keys = list(base) + [k for k in flags if k not in base]
    return {k: flags.get(k) for k in keys if not same_value(base.get(k), flags.get(k))}


def expand_cells(c: Campaign) -> list[Cell]:
    """Base cell first, then each axis value that differs from the base (axis order, value order), then
    explicit cells. With `cross: true`, every combination of the axes instead. Duplicates and explicit
    cells that differ from the base in more than one flag are errors. A bundle-axis value equal to the
    base names the base cell (e.g. `mmap`)."""
    base = dict(c.flags)
    base_label = "base"
    raw: list[tuple[dict[str, FlagValue], Where, str | None]] = [(base, c.flags_line, None)]
    if c.cross and c.axes:
        for combo in itertools.product(*[list(a.values) for a in c.axes]):
            flags = dict(base)
            for v in combo:
                flags.update(v.flags)
            label = " ".join(v.label for v in combo if _diff(base, {**base, **v.flags}))
            raw.append((flags, combo[0].line, label))
    else:
        for ax in c.axes:
            for v in ax.values:
                flags = {**base, **v.flags}
                if not _diff(base, flags) and not ax.is_flag:
                    base_label = v.label
                raw.append((flags, v.line, v.label))
    problems: list[tuple[Where, str]] = []
    for ec in c.cells:
        flags = {**base, **ec.flags}
        d = _diff(base, flags)
        if len(d) > 1 and not c.cross:
            problems.append((ec.line, f"cell {cell_label(d)} differs from the base in {len(d)} flags "
                                      f"({', '.join(d)}); vary one at a time, or set cross: true"))
        raw.append((flags, ec.line, None))

    cells: list[Cell] = []
    seen: dict[str, Where] = {}
    for flags, line, label in raw:
        d = _diff(base, flags)
        key = cell_label(d)
        if key in seen:
            if d:  # an axis value equal to the base is simply the base cell
                first = f"line {seen[key]}" if isinstance(seen[key], int) else seen[key]
                problems.append((line, f"cell {label or key} is listed twice (first at {first})"))
            continue
        seen[key] = line
        # keep base flags first, in their order, for readable argv
        full = {k: flags[k] for k in list(base) + [k for k in flags if k not in base]}
        name = base_label if not d else (label or key)
        cells.append(Cell(index=len(cells), flags=full, varied=d, line=line, name=name))
    if problems:
        problems.sort(key=lambda t: (where_order(t[0]), t[1]))
        raise CampaignError([f"{c.place(w)}: {m}" for w, m in problems])
    if c.engines:
        cells = _cross_engines(cells, list(c.engines))
    if len(cells) < 2:
        raise CampaignError([f"{c.place(c.lines.get('axes', 1))}: the campaign has only the base cell: "
                             f"add an axis (axes: [{{flag: --x, values: [a, b]}}]) with a value that differs "
                             f"from the base"])
    return cells


def _cross_engines(settings: list[Cell], engines: list[str]) -> list[Cell]:
    """Every cell once per engine, side by side (so the run order keeps the engines of a setting adjacent):
    the same flags, its own engine. A cell of another engine than the reference varies `engine` too, so its
    ratio to the base is the engine's at the base setting; `setting` points at the reference's cell."""
    out: list[Cell] = []
    for s in settings:
        ref = len(out)
        for e in engines:
            varied = {**s.varied, **({"engine": e} if e != engines[0] else {})}
            out.append(Cell(index=len(out), flags=s.flags, varied=varied, line=s.line, name=f"{e} {s.label}",
                            engine=e, setting=ref))
    return out


def order_runs(n_cells: int, repeats: int, order: str, seed: int) -> list[RunSpec]:
    """Every cell once per round. interleaved: 0..n-1 each round; alternating: reversed on odd rounds
    (cancels order bias); random: a seeded shuffle per round."""
    rng = random.Random(seed)
    runs: list[RunSpec] = []
    for rnd in range(repeats):
        idx = list(range(n_cells))
        if order == "alternating" and rnd % 2 == 1:
            idx.reverse()
        elif order == "random":
            rng.shuffle(idx)
        elif order not in ("interleaved", "alternating"):
            raise ValueError(f"unknown order {order!r}")
        for ci in idx:
            runs.append(RunSpec(run_id=make_run_id(rnd, ci), round=rnd, cell=ci, position=len(runs)))
    return runs
