"""Whole-campaign validation: load, expand, order, and ask the engine's own flag parser about every cell.

`plan_campaign(path)` is what `bmoe-bench validate` and `bmoe-bench run` call first."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.campaigns.expand import Cell, RunSpec, expand_cells, flags_argv, order_runs
from harness.campaigns.schema import Campaign, load_campaign
from harness.campaigns.yamlsrc import CampaignError
from harness.errors import UserError
from harness.formats.campaign import FlagValue
from harness.formats.campaign_fleet import FleetRecord
from harness.formats.folder import COMPUTE_TRACE_FILE, IO_TRACE_FILE, PROMPTS_FILE, REPLIES_FILE


@dataclass(frozen=True)
class Plan:
    campaign: Campaign
    cells: list[Cell]
    runs: list[RunSpec]
    fleet: FleetRecord | None = None  # a fleet campaign's devices, once known (harness.campaigns.fleet.fleet_plan)


def engine_argv_tail(c: Campaign, cell: Cell, *, model: str, csv: str | None, progress: bool,
                     prompts: str = PROMPTS_FILE, replies: str = REPLIES_FILE,
                     io_trace: str = IO_TRACE_FILE, compute_trace: str = COMPUTE_TRACE_FILE) -> list[str]:
    """Everything after the engine executable: harness-owned flags, then the cell's flags (on an engines
    axis: with that engine's own flags added and its spellings applied; a quality campaign's questions and
    replies files: `prompts`, `replies`)."""
    e = c.engine_of(cell.engine)
    a = e.args
    argv = [str(a["model"]), model, str(a["prompt"]), c.prompt, str(a["tokens"]), str(c.tokens)]
    if csv is not None:
        argv += [str(a["csv"]), csv]
    if progress and a.get("progress"):
        argv.append(str(a["progress"]))
    if c.quality is not None:
        argv += ["--prompts-file", prompts, "--replies", replies]
    if c.traces:
        argv += ["--io-trace", io_trace, "--compute-trace", compute_trace]
    return argv + flags_argv(spelled({**cell.flags, **getattr(e, "flags", {})}, getattr(e, "spell", {})))


def spelled(flags: dict[str, FlagValue], spell: dict[str, str | None]) -> dict[str, FlagValue]:
    """Flags in an engine's own spelling: renamed where `spell` says, dropped where it maps to None."""
    out: dict[str, FlagValue] = {}
    for k, v in flags.items():
        if k in spell and spell[k] is None:
            continue
        out[spell.get(k) or k] = v
    return out


def engine_refusals(c: Campaign, cells: list[Cell]) -> list[str]:
    """`file:line: ...` for every cell the bmoe engine's own parser refuses (external engines: none); a
    cell refused for the same reason as the base cell is not listed again."""
    if all(c.engine_of(e).kind != "bmoe" for e in c.engine_labels()):
        return []
    from harness.engine.config import parse_cli

    out = []
    base = None  # a refusal of the base cell, reported once there rather than again for every cell
    for cell in cells:
        if c.engine_of(cell.engine).kind != "bmoe":
            continue
        try:
            parse_cli(engine_argv_tail(c, cell, model="model.gguf", csv="run.csv", progress=True))
        except UserError as e:
            if cell.is_base:
                base = str(e)
            elif str(e) == base:
                continue
            out.append(f"{c.place(cell.line)}: cell {cell.label}: the engine would refuse it: {e}")
    return out


def local_file_problems(c: Campaign) -> list[str]:
    out = []
    if c.target.kind == "local" and c.model.path is not None and not c.resolve_local(c.model.path).is_file():
        out.append(f"{c.place(c.lines.get('model', 1))}: model.path {c.model.path} does not exist "
                   f"(relative paths are from {c.base_dir or '.'}); give a file, or a recipe to generate one")
    for what, p in (("model.push_from", c.model.push_from), ("engine.push_from", c.engine.push_from)):
        if p is not None and not c.resolve_local(p).is_file():
            out.append(f"{c.place(c.lines.get(what.split('.')[0], 1))}: {what} {p} does not exist")
    for label in c.engine_labels():
        e, key = c.engine_of(label), f"engines.{label}" if label else "engine"
        if label and e.push_from is not None and not c.resolve_local(e.push_from).is_file():
            out.append(f"{c.place(c.lines.get('engines', 1))}: {key}.push_from {e.push_from} does not exist")
        if c.target.kind == "local" and e.kind == "external" and e.path is not None:
            if not c.resolve_local(e.path).is_file():
                out.append(f"{c.place(c.lines.get(key.split('.')[0], 1))}: {key}.path {e.path} does not exist")
    return out


def question_problems(c: Campaign) -> list[str]:
    """A quality block asking for questions the suite does not have."""
    if c.quality is None:
        return []
    from harness.quality.gsm8k import select

    try:
        select(c.quality.n, c.quality.ids)
    except UserError as e:
        return [f"{c.place(c.lines.get('quality', 1))}: {e}"]
    return []


def plan_campaign(path: Path | str, *, check_files: bool = True, overrides: list[str] | tuple[str, ...] = ()
                  ) -> Plan:
    """Load (with `--set KEY=VALUE` overrides applied), expand, order and check a campaign; CampaignError
    lists every problem with file:line (or the --set argument it came from)."""
    c = load_campaign(path, overrides)
    cells = expand_cells(c)
    problems = engine_refusals(c, cells) + question_problems(c)
    if c.fidelity is not None:
        from harness.campaigns.fidelity import plan_scoring, text_of

        problems += list(plan_scoring(c, cells).problems)
        if check_files:
            try:
                text_of(c)
            except UserError as e:
                problems.append(str(e))
    if check_files:
        problems += local_file_problems(c)
    if problems:
        raise CampaignError(problems)
    return Plan(campaign=c, cells=cells, runs=order_runs(len(cells), c.min_repeats(), c.order, c.seed))
