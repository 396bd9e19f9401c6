"""A campaign's fidelity scoring (its `fidelity:` section, harness.formats.campaign_fidelity): the text, the
reference's command (made once per campaign: the base cell's flags plus the section's), which cells are scored
against it and each one's command, and the plan's record of all that.

Teacher-forced scoring is one prompt batch per chunk by default, so a knob that acts only while decoding one token
at a time cannot be scored: a cell with --route-ahead is refused at validation, in one line; a cell with
--drop-cold-experts (any value) is scored with --drop-in-prefill added, so the scoring applies the cell's drop rule
to every scored position (its speed runs keep the cell's own flags; the findings say which cells were scored so).
With `decode: true` every scoring run decodes one token at a time (--fidelity-decode): the cells' own flags are
scored as they act in generation, nothing is added and nothing refused.

The text is untrusted input: a text_file must lie inside the campaign's folder or this checkout (symbolic links
resolved) and be at most MAX_TEXT_BYTES."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from harness.campaigns.expand import Cell, flags_argv
from harness.campaigns.schema import Campaign
from harness.errors import UserError
from harness.formats.campaign import FlagValue
from harness.formats.campaign_fidelity import FidelityRecord
from harness.formats.folder import FIDELITY_CSV, FIDELITY_REF

CTX_FLAGS = ("-c", "--ctx-size")  # the reference's context size is the section's ctx; scoring runs take it from it
DROP, DROP_IN_PREFILL, ROUTE_AHEAD = "--drop-cold-experts", "--drop-in-prefill", "--route-ahead"
DECODE = "--fidelity-decode"


MAX_TEXT_BYTES = 4 << 20  # 4 MiB: far above any text a campaign scores here, far below a mistaken file
CHECKOUT = Path(__file__).resolve().parents[2]  # this checkout's root (harness/campaigns/ is two levels down)


def _inside(p: Path, roots: list[Path]) -> bool:
    return any(p == r or r in p.parents for r in roots)


def text_of(c: Campaign) -> str:
    f = c.fidelity
    assert f is not None
    if f.text is not None:
        return f.text
    where = f"{c.place(c.lines.get('fidelity', 1))}: fidelity.text_file {f.text_file}"
    p = c.resolve_local(str(f.text_file)).resolve()
    roots = [Path(c.base_dir or ".").resolve(), CHECKOUT]
    if not _inside(p, roots):
        raise UserError(f"{where}: outside the campaign's folder and this checkout; copy the text beside the campaign "
                        "file")
    try:
        size = p.stat().st_size
        if not p.is_file():
            raise IsADirectoryError
        if size > MAX_TEXT_BYTES:
            raise UserError(f"{where}: {size} bytes, more than the {MAX_TEXT_BYTES} a scored text may have; give a "
                            "smaller sample")
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{where}: cannot read it as UTF-8 text ({type(e).__name__}); give a text file (relative "
                        f"paths are from {c.base_dir or '.'})") from None


def _given(v: FlagValue) -> bool:  # a flag's value that puts it on the command line (0 included)
    return v is not None and v is not False


def _scoring_flags(flags: dict[str, FlagValue], decode: bool = False) -> dict[str, FlagValue]:
    """A cell's flags as a scoring run takes them: no context size; in batches, --drop-in-prefill wherever a drop
    rule is set; one token at a time (`decode`), --fidelity-decode and the cell's own flags."""
    out = {k: v for k, v in flags.items() if k not in CTX_FLAGS}
    if decode:
        out[DECODE] = True
    elif _given(out.get(DROP)):
        out[DROP_IN_PREFILL] = True
    return out


def drop_added(flags: dict[str, FlagValue], decode: bool = False) -> bool:
    """Whether scoring this cell adds --drop-in-prefill to a drop rule that drops something (a rule of 0 drops
    nothing anywhere: the flag is added there too, as the engine asks, but changes nothing); never one token at a
    time."""
    if decode:
        return False
    v = flags.get(DROP)
    return _given(v) and str(v) not in ("0", "0.0") and not _given(flags.get(DROP_IN_PREFILL))


def ref_flags(c: Campaign, base: Cell) -> dict[str, FlagValue]:
    assert c.fidelity is not None
    return _scoring_flags({**base.flags, **getattr(c.engine_of(base.engine), "flags", {}), **c.fidelity.flags},
                          c.fidelity.decode)


def ref_argv_tail(c: Campaign, base: Cell, *, model: str, text: str, out: str) -> list[str]:
    f = c.fidelity
    assert f is not None
    return ["-m", model, *flags_argv(ref_flags(c, base)), "-p", text, "-c", str(f.ctx), "--fidelity-ref", out,
            "--fidelity-top-k", str(f.top_k), "--fidelity-chunks", str(f.chunks)]


def against_argv_tail(c: Campaign, cell: Cell, *, model: str, ref: str, csv: str) -> list[str]:
    assert c.fidelity is not None
    own = _scoring_flags({**cell.flags, **getattr(c.engine_of(cell.engine), "flags", {})}, c.fidelity.decode)
    return ["-m", model, *flags_argv(own), "--fidelity-against", ref, "--fidelity-csv", csv]


@dataclass(frozen=True)
class Scoring:
    """The cells scored (by index) and the refusals (`file:line: ...`), from the engine's own parser."""

    cells: tuple[int, ...]
    problems: tuple[str, ...]


def plan_scoring(c: Campaign, cells: list[Cell]) -> Scoring:
    """Which cells are scored: every one (cells: all), or those whose lossy knobs differ from the reference's."""
    from harness.engine import SPECS, parse_cli

    f = c.fidelity
    if f is None:
        return Scoring((), ())
    base = next(x for x in cells if x.is_base and not x.engine) if not c.engines else cells[0]
    where = c.place(c.lines.get("fidelity", 1))
    try:
        ref = parse_cli(ref_argv_tail(c, base, model="model.gguf", text="text", out=FIDELITY_REF))
    except UserError as e:
        return Scoring((), (f"{where}: fidelity: the engine would refuse the reference run: {e}",))
    lossy = [s.name for s in SPECS if s.flag.lossy]
    scored, problems = [], []
    for cell in cells:
        if not f.decode and _given(cell.flags.get(ROUTE_AHEAD)) and str(cell.flags.get(ROUTE_AHEAD)) != "0":
            problems.append(f"{c.place(cell.line)}: cell {cell.label}: --route-ahead acts only while decoding one "
                            f"token at a time, so teacher-forced scoring in prompt batches cannot measure it; give "
                            f"the fidelity section decode: true (one token at a time, as generation)")
            continue
        try:
            cfg = parse_cli(against_argv_tail(c, cell, model="model.gguf", ref=FIDELITY_REF, csv=FIDELITY_CSV))
        except UserError as e:
            problems.append(f"{c.place(cell.line)}: cell {cell.label}: the engine would refuse its scoring run: {e}")
            continue
        if f.cells == "all" or any(getattr(cfg, n) != getattr(ref, n) for n in lossy):
            scored.append(cell.index)
    return Scoring(tuple(scored), tuple(problems))


def fidelity_record(c: Campaign, cells: list[Cell]) -> FidelityRecord:
    """The plan's record of the scoring: the text (its sha256 and size), the section, the cells scored."""
    f = c.fidelity
    assert f is not None
    text = text_of(c)
    return FidelityRecord(text_sha256=hashlib.sha256(text.encode()).hexdigest(), text_chars=len(text),
                          text_file=f.text_file, ctx=f.ctx, chunks=f.chunks, top_k=f.top_k, flags=f.flags,
                          cells=f.cells, scored=list(plan_scoring(c, cells).cells),
                          drop_in_prefill_added=[x.index for x in cells if drop_added(x.flags, f.decode)],
                          **({"decode": True} if f.decode else {}))
