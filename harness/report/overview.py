"""reports/README.md: every campaign folder under bench-data/ in one table per model, in the form of the
original C++ engine's benchmark tables (setup, active experts, cache, lanes, tok/s, flash read per
token, cache hit), each row naming the folder it comes from.

Everything comes from each folder's raw data through the per-folder report code (`load_campaign_data`,
`compute_results`): the model and each cell's configuration from the metrics CSV preambles (arch,
n_layer, n_expert, cfg.n_expert_used, cfg.cache_mb, cfg.io_threads, mode, ...), the target and the
protocol from the manifest; never from folder or file names. A folder without a manifest is not a
campaign: it is listed under "Not in the tables" (a cache-replay study, when it holds a replay.csv).

`build_overview` reads and returns the text, writing nothing; `render` is the pure part;
`write_overview` and `check_overview` are the thin I/O around them.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import UserError
from harness.formats.files import atomic_write_text
from harness.formats.folder import MANIFEST
from harness.report.collect import CampaignData, load_campaign_data
from harness.report.fidelity import cell_fidelity, kld_text
from harness.report.results import CellResult, Results, compute_results
from harness.stats import Interval

REPORT = "README.md"


@dataclass(frozen=True)
class Model:
    """A model as the engine saw it (CSV preamble), plus where it came from (manifest)."""

    arch: str
    n_layer: int
    n_expert: int
    top_k: int  # the model's own experts per token
    bytes: int
    source: str  # "synthetic, make-model recipe shape=..." or the model file's name

    def title(self) -> str:
        return (f"{self.arch}, {self.n_layer} layers, {self.n_expert} experts, top-{self.top_k}: "
                f"{self.bytes / 1e9:.1f} GB ({self.source})")


@dataclass
class Row:
    setup: str
    active: str
    cache: str
    lanes: str
    tok_s: str
    flash: str
    hit: str
    folder: str
    flags: dict[str, str] = field(default_factory=dict)  # engine flags not in the columns: name -> value as run
    kld: str = ""  # a fidelity campaign's scored cell: mean KLD [95% over chunks]; "" where not measured


@dataclass
class Folder:
    """One campaign folder, summarised."""

    name: str
    created: str
    model: Model | None  # None when no run finished (nothing to table)
    rows: list[Row] = field(default_factory=list)
    note: str = ""  # one line on how it was measured


# ---- one folder (pure: CampaignData and Results in) ----------------------------------------------------


def _sig(x: float, digits: int = 3) -> int:
    """Decimals that show x with `digits` significant digits (none for large x)."""
    if x == 0 or not math.isfinite(x):
        return 0
    return max(0, digits - 1 - math.floor(math.log10(abs(x))))


def fmt_tok_s(iv: Interval | None, c: CellResult) -> str:
    if iv is None:
        return f"no result ({len(c.failures)} of {c.n_runs} runs failed)"
    nd = _sig(iv.point)
    s = f"{iv.point:.{nd}f} [{iv.low:.{nd}f}, {iv.high:.{nd}f}]" if iv.between_runs else \
        f"{iv.point:.{nd}f} (1 run: spread between runs unknown)"
    if c.n_ok < c.n_runs:
        s += f" ({c.n_ok} of {c.n_runs} runs)"
    return s


def _mib(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.{_sig(x)}f} MiB"


def _pct(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.0f}%"


def _none(v: str | None) -> bool:
    return v is None or v in ("", "None")


def model_of(data: CampaignData, res: Results) -> Model | None:
    cfg = res.fixed_config
    keys = ("arch", "n_layer", "n_expert", "n_expert_used_model", "model_bytes")
    if any(k not in cfg for k in keys):
        return None
    m = data.manifest.model
    recipe = m.recipe
    if recipe:
        source = "synthetic, make-model recipe " + ", ".join(f"{k}={v}" for k, v in recipe.items())
    else:
        source = Path(str(m.file or cfg.get("model_file") or "?")).name
    return Model(cfg["arch"], int(cfg["n_layer"]), int(cfg["n_expert"]), int(cfg["n_expert_used_model"]),
                 int(cfg["model_bytes"]), source)


def cell_row(c: CellResult, model: Model, cap_mib: float | None, folder: str) -> Row:
    cfg = c.config
    streamed = cfg.get("mode") == "stream"
    cache_mb = cfg.get("cfg.cache_mb")
    cache_on = streamed and cache_mb not in (None, "0")
    setup = ["streamed" if streamed else "mmap baseline"]
    if cache_on and not _none(cfg.get("cfg.cache_policy")):
        setup.append(str(cfg["cfg.cache_policy"]))
    if streamed and cfg.get("cfg.cache_preload") == "True":
        setup.append("cache preloaded")
    if streamed and cfg.get("cfg.odirect") == "False":
        setup.append("buffered reads")
    dense = cfg.get("dense_weights")  # the effective mode (absent in folders older than the flag)
    if dense and (streamed or dense != "mmap"):
        setup.append(f"dense weights {dense}")
    if not _none(cfg.get("cfg.route_replay")):
        setup.append(f"routing replayed from {Path(str(cfg['cfg.route_replay'])).name}")
    if not _none(cfg.get("cfg.drop_cold_experts")):
        setup.append(f"--drop-cold-experts {cfg['cfg.drop_cold_experts']} (lossy)")
    if cap_mib:
        setup.append(f"RAM cap {cap_mib:g} MiB")
    k = cfg.get("cfg.n_expert_used")
    active = str(model.top_k) if _none(k) or k == "0" else str(k)
    if not streamed:
        cache = "n/a"
    elif cache_mb == "0":
        cache = "off"
    elif cache_mb == "auto":
        ceil = cfg.get("cfg.cache_ceil_mb")
        budget = cfg.get("cache_budget_bytes")
        cache = "auto" + ("" if _none(ceil) else f", cap {ceil}")
        if budget and budget.isdigit():
            cache += f" ({int(budget) / 2**20:.0f} MiB)"
    else:
        cache = f"{cache_mb} MiB"
    lanes = str(cfg.get("cfg.io_threads", "?")) if streamed else "n/a"
    hit = _pct(c.hit_pct) if cache_on else "n/a"
    return Row(setup=", ".join(setup), active=active, cache=cache, lanes=lanes, tok_s=fmt_tok_s(c.tok_s, c),
               flash=_mib(c.mib_per_tok), hit=hit, folder=folder,
               flags={**other_flags(cfg), "recycle_pages": recycled(cfg, streamed)})


def recycled(cfg: dict[str, str], streamed: bool) -> str:
    """What --recycle-pages did in a run: move, memfd or off. The kind that took effect (`recycle_pages_effective`,
    since auto became the default); before that, the kind asked for (off the default then, and absent before the
    flag existed); an mmap run recycles nothing. So rows differ only where recycling did."""
    if not streamed:
        return "off"
    eff = cfg.get("recycle_pages_effective")
    if eff:
        return str(eff).split()[0]
    return str(cfg.get("cfg.recycle_pages") or "off")


# engine flags the columns already show (Setup, Active experts, Cache, Lanes), or a run's own paths and texts
_SHOWN = {"moe_stream", "cache_mb", "cache_ceil_mb", "cache_policy", "cache_preload", "odirect", "dense_weights",
          "route_replay", "drop_cold_experts", "n_expert_used", "io_threads", "model", "prompt", "csv", "progress",
          "route_trace", "replies", "prompts_file", "io_trace", "compute_trace",
          "n_predict"}  # tokens per run: the campaign's, in the folder's note


def other_flags(cfg: dict[str, str]) -> dict[str, str]:
    """A cell's engine flags (CSV preamble cfg.*) that no column shows; a flag its build did not have yet
    is absent (its default applies)."""
    return {k[4:]: v for k, v in cfg.items() if k.startswith("cfg.") and k[4:] not in _SHOWN}


def _flag_text(name: str, value: str) -> str:
    from harness.engine import SPECS

    spec = next((s for s in SPECS if s.name == name), None)
    if spec is None:
        return f"{name}={value}"
    if spec.switch:
        on = value == str(not spec.default)
        return spec.label if on else f"not {spec.label}"
    return f"{spec.label} {value}"


def _default(name: str) -> str | None:
    from harness.engine import SPECS

    spec = next((s for s in SPECS if s.name == name), None)
    return None if spec is None else str(spec.shown(spec.default))


def differing(rows: list[Row]) -> list[list[str]]:
    """For each row, the flags that vary in its table set to other than the table's common base (a switch:
    its default state; a value: the one most rows have, a tie going to the default), as llama-bench shows
    only what varies; the other columns show the rest."""
    from harness.engine import SPECS

    order = {s.name: i for i, s in enumerate(SPECS)}  # the flag table's order, unknown names last
    names = sorted(set().union(*(r.flags for r in rows)) if rows else [], key=lambda n: (order.get(n, 999), n))
    out: list[list[str]] = [[] for _ in rows]
    for n in names:
        vals = [r.flags.get(n, _default(n)) for r in rows]
        if len(set(vals)) < 2:
            continue
        default = _default(n)
        if default in ("True", "False"):  # a switch: its default state
            base = default
        else:  # a value: the one most rows have, a tie going to the default
            top = max(vals.count(v) for v in vals)
            common = sorted(str(v) for v in set(vals) if vals.count(v) == top)
            base = default if default in common else common[0]
        for i, v in enumerate(vals):
            if v != base:
                out[i].append(_flag_text(n, str(v)))
    return out


def summarize(name: str, data: CampaignData, res: Results, kld: dict[int, str] | None = None) -> Folder:
    """A campaign folder's rows and its one-line note (pure); `kld`: a fidelity campaign's mean KLD text by cell
    index (harness.report.fidelity)."""
    m, p = data.manifest, data.plan
    tgt = m.target
    cap = getattr(tgt, "mem_cap_mib", None)
    model = model_of(data, res)
    who = getattr(tgt, "serial", None) or getattr(tgt, "host", None) or ""
    where = (f"this machine ({getattr(tgt, 'cpus', None)} CPUs, {getattr(tgt, 'cpu_model', None)})"
             if tgt.kind == "local" else f"{tgt.kind} device {who}".strip())
    commit = (m.harness.commit or "?")[:12]
    runs = f"{res.precision.rounds} runs (until precise)" if res.precision else f"{p.repeats} runs" + (
        f" in each of {p.replicate.tries} tries" if p.replicate else "")
    note = (f"{len(data.cells)} cells x {runs} of {p.tokens} tokens (first "
            f"{data.warmup} dropped as warm-up), on {where}"
            + (f" under a {cap:g} MiB memory cap" if cap else "")
            + f"; harness commit `{commit}`; reproduce: `{m.reproduce}`.")
    if p.engines:  # an engines axis: the model and each setting as the reference engine (bmoe) recorded them
        model = model_of(data, dataclasses.replace(res, fixed_config=res.cells[0].config))
    f = Folder(name=name, created=m.created, model=model, note=note)
    if model is not None and p.engines:
        by = {c.index: c for c in res.cells}
        for pc, c in zip(data.cells, res.cells, strict=True):
            ref = by[pc.setting if pc.setting is not None else pc.index]
            row = cell_row(dataclasses.replace(c, config=ref.config), model, cap, name)
            row.setup = f"{pc.engine}: {row.setup}"
            f.rows.append(row)
    elif model is not None:
        f.rows = [cell_row(c, model, cap, name) for c in res.cells]
        for pc, row in zip(data.cells, f.rows, strict=True):  # a compare fleet: each row names its device
            if getattr(pc, "device", None):
                row.setup = f"{pc.device}: {row.setup}"
    if model is not None and kld:
        for c, row in zip(res.cells, f.rows, strict=True):
            row.kld = kld.get(c.index, "")
    return f


# ---- all folders (pure: summaries in, markdown out) ----------------------------------------------------

_COLUMNS = ["Setup", "Active experts", "Cache", "Lanes", "tok/s [95% CI]", "Flash/token", "Cache hit", "Folder"]
KLD_COLUMN = "Mean KLD [95% over chunks]"
_RIGHT = {"Active experts", "Cache", "Lanes", "tok/s [95% CI]", "Flash/token", "Cache hit", KLD_COLUMN}


def render(folders: list[Folder], others: list[tuple[str, str]], bench_link: str) -> str:
    """The whole README. folders: campaign summaries; others: (folder name, why it is not tabled);
    bench_link: the path from the report to bench-data/, for the links."""
    tabled = sorted((f for f in folders if f.model is not None), key=lambda f: (f.created, f.name))
    models: dict[Model, list[Folder]] = {}
    for f in tabled:
        models.setdefault(f.model, []).append(f)
    out = [
        "# Benchmarks across campaigns",
        "",
        "Generated by `bmoe-bench report --all` from `bench-data/` alone; do not edit by hand "
        "(`bmoe-bench report --all --check` fails when this file differs from what the raw data gives).",
        "",
        "**How to read the tables.** One table per model; each row is one cell of one campaign, and the "
        "folder it comes from has the raw data, its findings.md and the command that reproduces it. "
        "Rows in a table can come from different campaigns and engine versions: compare rows of the same "
        "folder first. *Setup* names, in `code`, every engine flag that varies within the table where a row "
        "differs from the table's common base (a switch: its default; a value: the one most rows have). "
        "*mmap baseline* is the same file loaded the ordinary way (no streaming). *Active "
        "experts* is how many experts each token routes to (`--n-expert-used`; below the model's own "
        "it is lossy). *tok/s* is the mean over a cell's runs of tokens / their summed wall time, "
        "warm-up tokens dropped, with a seeded bootstrap 95% CI across runs. *Flash/token* is data read "
        "from storage per token (for an mmap baseline under a cap: its page-fault reads) and *cache hit* "
        "the share of expert reads served from the expert cache, at the last token." + (
            " *Mean KLD* (in a table with a fidelity campaign) is the cell's KL divergence from its campaign's "
            "lossless reference on a fixed text, in nats, with a 95% t interval over chunks; – where not measured."
            if any(r.kld for f in tabled for r in f.rows) else ""),
        "",
    ]
    for model, fs in models.items():
        rows = [r for f in fs for r in f.rows]
        with_kld = any(r.kld for r in rows)  # the KLD column: only in a table where some cell was measured
        cols = _COLUMNS[:-1] + [KLD_COLUMN] * with_kld + _COLUMNS[-1:]
        out += [f"## {model.title()}", "",
                "| " + " | ".join(cols) + " |",
                "|" + "|".join("---:" if c in _RIGHT else "---" for c in cols) + "|"]
        for r, extra in zip(rows, differing(rows), strict=True):
            link = f"[{r.folder}]({bench_link}/{r.folder}/findings.md)"
            setup = ", ".join([r.setup, *(f"`{x}`" for x in extra)])
            kld = [r.kld or "–"] * with_kld
            out.append("| " + " | ".join([setup, r.active, r.cache, r.lanes, r.tok_s, r.flash, r.hit, *kld, link])
                       + " |")
        out.append("")
        out += [f"- `{f.name}`: {f.note}" for f in fs]
        out.append("")
    untabled = [(f.name, "no run finished successfully") for f in folders if f.model is None]
    rest = sorted(others + untabled)
    if rest:
        out += ["## Not in the tables", ""]
        out += [f"- [`{name}`]({bench_link}/{name}/findings.md): {why}" for name, why in rest]
        out.append("")
    return "\n".join(out)


# ---- I/O ----------------------------------------------------------------------------------------------


def _not_a_campaign(folder: Path) -> str:
    """Why a folder without a manifest is not tabled, from the files it holds."""
    replay = folder / "replay.csv"
    if replay.is_file():
        with open(replay, newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
        grid: dict[str, tuple[set, set]] = {}
        for r in rows:
            pol, bud = grid.setdefault(str(r.get("trace")), (set(), set()))
            pol.add(r.get("policy"))
            bud.add(r.get("budget_mib"))
        per_trace = "; ".join(f"{t}: {len(pol)} policies x {len(bud)} budgets"
                              for t, (pol, bud) in sorted(grid.items()))
        return (f"a cache-replay study, not a campaign (no {MANIFEST}, no engine runs): cache policies "
                f"replayed on recorded routing traces ({per_trace}); its replay.csv has hit % and MiB/token, "
                f"not tok/s")
    return f"no {MANIFEST}: not a campaign folder"


def build_overview(bench_root: Path | str, out_dir: Path | str) -> str:
    """reports/README.md's text from the folders under bench_root (reads them, writes nothing)."""
    bench_root, out_dir = Path(bench_root), Path(out_dir)
    if not bench_root.is_dir():
        raise UserError(f"{bench_root}: no such folder; run from the repository root, or name the bench-data "
                        f"folder")
    folders: list[Folder] = []
    others: list[tuple[str, str]] = []
    for d in sorted(p for p in bench_root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if not (d / MANIFEST).is_file():
            others.append((d.name, _not_a_campaign(d)))
            continue
        data = load_campaign_data(d)
        fid = cell_fidelity(data)
        folders.append(summarize(d.name, data, compute_results(data),
                                 {f.index: kld_text(f) for f in fid} if fid else None))
    link = Path(os.path.relpath(bench_root.resolve(), out_dir.resolve())).as_posix()
    return render(folders, others, link)


def write_overview(bench_root: Path | str, out_dir: Path | str) -> Path:
    out_dir = Path(out_dir)
    text = build_overview(bench_root, out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / REPORT, text)
    return out_dir / REPORT


def check_overview(bench_root: Path | str, out_dir: Path | str) -> str | None:
    """None when out_dir/README.md is what bench_root gives, else what is wrong with it ("is missing",
    "differs from what bench-data gives")."""
    text = build_overview(bench_root, out_dir)
    p = Path(out_dir) / REPORT
    if not p.is_file():
        return "is missing"
    return None if p.read_text(encoding="utf-8") == text else f"differs from what {bench_root} gives"
