"""Whole-campaign validation: load, expand, order, and ask the engine's own flag parser about every cell.

`plan_campaign(path)` is what `bmoe-bench validate` and `bmoe-bench run` call first."""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import Path

from harness.campaigns.expand import Cell, RunSpec, expand_cells, flags_argv, order_runs
from harness.campaigns.schema import Campaign, load_campaign
from harness.campaigns.yamlsrc import CampaignError
from harness.errors import UserError
from harness.formats.campaign import FlagValue
from harness.formats.campaign_fleet import FleetRecord
from harness.formats.campaign_replicate import planned_rounds
from harness.formats.folder import COMPUTE_TRACE_FILE, IO_TRACE_FILE, PROMPTS_FILE, REPLIES_FILE


@dataclass(frozen=True)
class Plan:
    campaign: Campaign
    cells: list[Cell]
    runs: list[RunSpec]
    fleet: FleetRecord | None = None  # a fleet campaign's devices, once known (fleet.devices.fleet_plan)


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
    from harness.engine import SPECS, parse_cli

    # flags that print something and exit 0 (argparse's help included): a run would make no CSV, and no folder
    actions = {"-h", "--help", *(f for s in SPECS if s.flag.action for f in s.flag.flags)}
    out = []
    base = None  # a refusal of the base cell, reported once there rather than again for every cell
    for cell in cells:
        if c.engine_of(cell.engine).kind != "bmoe":
            continue
        said = sorted(actions.intersection({**cell.flags, **getattr(c.engine_of(cell.engine), "flags", {})}))
        try:
            if said:
                raise UserError(f"{said[0]} prints something and exits, no run; remove it from the campaign's flags")
            parse_cli(engine_argv_tail(c, cell, model="model.gguf", csv="run.csv", progress=True))
        except UserError as e:
            if cell.is_base:
                base = str(e)
            elif str(e) == base:
                continue
            out.append(f"{c.place(cell.line)}: cell {cell.label}: the engine would refuse it: {e}")
    return out


def _not_a_file(p: Path) -> str | None:
    """Why p cannot be hashed and staged as a file ("" when it can; None when it does not exist): a FIFO blocks,
    /dev/zero never ends, /proc/self/mem answers EIO (a /proc file reads as 0 bytes)."""
    try:
        st = p.stat()
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file (a device, FIFO or socket)"
    try:
        with open(p, "rb") as f:
            f.read(1)
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    return ""


def local_file_problems(c: Campaign) -> list[str]:
    out = []
    if c.target.kind == "local" and c.model.path is not None:
        why = _not_a_file(c.resolve_local(c.model.path))
        if why is None:
            out.append(f"{c.place(c.lines.get('model', 1))}: model.path {c.model.path} does not exist "
                       f"(relative paths are from {c.base_dir or '.'}); give a file, or a recipe to generate one")
        elif why:
            out.append(f"{c.place(c.lines.get('model', 1))}: model.path {c.model.path} {why}; give the model file")
    for what, p in (("model.push_from", c.model.push_from), ("engine.push_from", c.engine.push_from)):
        why = _not_a_file(c.resolve_local(p)) if p is not None else ""
        if why is None:
            out.append(f"{c.place(c.lines.get(what.split('.')[0], 1))}: {what} {p} does not exist")
        elif why:
            out.append(f"{c.place(c.lines.get(what.split('.')[0], 1))}: {what} {p} {why}; give a file")
    for label in c.engine_labels():
        e, key = c.engine_of(label), f"engines.{label}" if label else "engine"
        if label and e.push_from is not None and not c.resolve_local(e.push_from).is_file():
            out.append(f"{c.place(c.lines.get('engines', 1))}: {key}.push_from {e.push_from} does not exist")
        if c.target.kind == "local" and e.kind == "external" and e.path is not None:
            if not c.resolve_local(e.path).is_file():
                out.append(f"{c.place(c.lines.get(key.split('.')[0], 1))}: {key}.path {e.path} does not exist")
    return out


NAME_MAX_CHARS = 120  # the folder .<date>-<name>.<pid>.tmp (and a shard's suffix) within a file name's 255 bytes
ARGV_MAX_BYTES = 120_000  # under Linux's 128 KiB for one argument, and for a remote shell's whole command line


def name_problems(c: Campaign) -> list[str]:
    """A name too long for its folder (creating it failed with ENAMETOOLONG, a traceback)."""
    n = len(c.name.encode("utf-8"))
    if n <= NAME_MAX_CHARS:
        return []
    return [f"{c.place(c.lines.get('name', 1))}: name is {n} characters; at most {NAME_MAX_CHARS} fit in its "
            "folder's name (bench-data/<date>-<name>/): shorten it"]


def argv_problems(c: Campaign, cells: list[Cell]) -> list[str]:
    """A command line the engine cannot be started with: Linux refuses an argument over 128 KiB (E2BIG), and an
    SSH or adb target passes the whole command line as one. A 200,000-character prompt validated, then every run
    and every resume failed with E2BIG and the runs stayed pending for ever."""
    out = []
    for cell in cells:
        argv = engine_argv_tail(c, cell, model=str(c.model.path or "model.gguf"), csv="run.csv", progress=True)
        size = sum(len(a.encode("utf-8", "surrogatepass")) + 3 for a in argv)  # a space and quotes each
        if size <= ARGV_MAX_BYTES:
            continue
        big = len(c.prompt.encode("utf-8", "surrogatepass"))
        if big * 2 > size:
            return [f"{c.place(c.lines.get('prompt', 1))}: prompt is {big:,} bytes; an engine's command line holds "
                    f"at most {ARGV_MAX_BYTES:,} (Linux's 128 KiB per argument, an SSH or adb target's whole command "
                    "line): shorten it, or score a long text with a fidelity: block (read from a file)"]
        out.append(f"{c.place(cell.line)}: cell {cell.label}: its engine command line is {size:,} bytes; at most "
                   f"{ARGV_MAX_BYTES:,} can be passed (Linux's 128 KiB per argument): shorten its flag values")
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
    problems = name_problems(c) + argv_problems(c, cells) + engine_refusals(c, cells) + question_problems(c)
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
    return Plan(campaign=c, cells=cells, runs=order_runs(len(cells), planned_rounds(c), c.order, c.seed))
