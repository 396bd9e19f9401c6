"""The campaign file (YAML): every key, its type, default and help, declared once as pydantic models.

`CampaignFile` is the whole file; its parts `ModelSource`, `TargetSpec`, `EngineSpec` and `Cooldown` are public for
the manifest's record of a plan. Values are strict: `tokens: "8"` is an error, not 8. Validation checks each value;
the rules between fields (exactly one model source, what a target or an engine kind allows, flags the harness owns)
are `CampaignFile.relation_problems()`, which lists every broken one at once as (location, message). A location is
the path of keys and list indices."""

from __future__ import annotations

from typing import Annotated, Literal, get_type_hints

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    WrapValidator,
)
from typing_extensions import TypedDict  # pydantic needs this one on Python < 3.12

from harness.formats.campaign_cooldown import COOLDOWN_LATER as COOLDOWN_LATER  # re-exported
from harness.formats.campaign_cooldown import Cooldown as Cooldown  # re-exported: many import it from here
from harness.formats.campaign_fidelity import FidelitySpec
from harness.formats.campaign_fleet import FleetSpec, FleetTarget, fleet_problems
from harness.formats.campaign_prepare import PrepareSpec
from harness.formats.campaign_replicate import Replicate, replicate_problems
from harness.formats.campaign_ssh import ssh_problems
from harness.formats.campaign_target import TargetSpec as TargetSpec  # re-exported
from harness.formats.campaign_types import FamilyName as _FamilyName
from harness.formats.campaign_types import FlagName, Flags, Label, Value, _check
from harness.formats.campaign_types import FlagValue as FlagValue  # re-exported
from harness.formats.campaign_types import render_value as render_value  # re-exported
from harness.formats.model_fields import ModelFields, recipe_fields

Loc = tuple[str | int, ...]

# how the harness passes what it owns to the engine; an external engine may spell these differently
DEFAULT_IO_ARGS: dict[str, str | None] = {"model": "-m", "prompt": "-p", "tokens": "-n", "csv": "--csv",
                                          "progress": "--progress"}
# every spelling of a flag the harness sets itself (for the `bmoe` engine), so campaigns cannot set them
BMOE_MANAGED = {"-m": "model", "--model": "model", "-p": "prompt", "--prompt": "prompt", "-n": "tokens",
                "--n-predict": "tokens", "--csv": "csv", "--progress": "progress", "--prompts-file": "quality",
                "--replies": "quality", "--io-trace": "traces", "--compute-trace": "traces",
                **dict.fromkeys(("--fidelity-ref", "--fidelity-against", "--fidelity-csv", "--fidelity-top-k",
                                 "--fidelity-chunks", "--fidelity-decode"), "fidelity")}
DEFAULT_PROMPT = "Explain how a mixture-of-experts model decides which experts handle each token."


def _keep_order(v: object, handler) -> object:
    """A TypedDict comes back in declaration order: give it back in the user's order."""
    out = handler(v)
    return {k: out[k] for k in v if k in out} if isinstance(v, dict) else out


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _recipe() -> type:
    """A make-model recipe: a named shape with some of the model's fields overridden (those
    harness.formats.model_fields marks for recipes; arch_params as a mapping, e.g. {mtp_bigram: 10})."""
    hints = get_type_hints(ModelFields)
    keys: dict[str, object] = {"shape": str, **{f.name: hints[f.name] for f in recipe_fields()}}
    if "arch_params" in keys:
        keys["arch_params"] = dict[str, int]
    recipe = TypedDict("Recipe", keys, total=False)  # type: ignore[misc]
    recipe.__pydantic_config__ = ConfigDict(extra="forbid", strict=True)  # type: ignore[attr-defined]
    return recipe


Recipe = _recipe()


class ModelSource(_Model):
    path: str | None = Field(None, description="model file on the target (relative: from the campaign's folder)")
    recipe: Annotated[Recipe, WrapValidator(_keep_order)] | None = Field(
        None, description="make-model recipe, e.g. {shape: small, n_layer: 16}: generated once, cached")
    push_from: str | None = Field(
        None, description="local model file to stage on the target (adb: pushed once, checked by size+hash)")
    hf: str | None = Field(None, description="a Hugging Face model, org/repo[:QUANT] or org/repo/file.gguf: pulled "
                           "into the local hub cache as `bmoe pull` does, then staged on the target like push_from")


class EngineArgs(TypedDict, total=False):
    """How an external engine spells the flags the harness sets (null: it has no such flag)."""

    __pydantic_config__ = ConfigDict(extra="forbid", strict=True)  # type: ignore[misc]
    model: FlagName
    prompt: FlagName
    tokens: FlagName
    csv: FlagName
    progress: FlagName | None


class EngineSpec(_Model):
    kind: Literal["bmoe", "external"] = Field("bmoe", description=(
        "bmoe (the installed console script; ssh, termux: the one `bmoe-bench deploy` put there) or external "
        "(any executable writing bmoe_metrics CSVs)"))
    path: str | None = Field(None, description="external: the engine executable on the target")
    push_from: str | None = Field(None, description="external: a local engine binary to stage on the target "
                                                    "(adb: pushed once)")
    args: Annotated[EngineArgs, AfterValidator(lambda a: {**DEFAULT_IO_ARGS, **a})] = Field(
        default_factory=lambda: dict(DEFAULT_IO_ARGS),
        description="external: how the engine spells model/prompt/tokens/csv/progress")


class EngineEntry(EngineSpec):
    """One engine of a campaign's `engines:` axis: what to run, and how it differs from the campaign's flags."""

    flags: Flags = Field(default_factory=dict, description=(
        "flags added to every cell of this engine only, e.g. {--force-cache: true}: pin a default of its own"))
    spell: dict[FlagName, FlagName | None] = Field(default_factory=dict, description=(
        "campaign flag -> this engine's spelling of it, or null when the engine has no such flag (omitted; "
        "the report still checks from the CSV preambles that the setting is the same)"))


class FlagAxis(_Model):
    flag: FlagName = Field(description="the engine flag this axis varies; or name, for an axis of labelled bundles")
    values: list[Value] = Field(min_length=1, description="the values of the flag, one cell each, e.g. [0, 64]")


class BundleAxis(_Model):
    name: str = Field(min_length=1, description="axis name (an axis of labelled flag bundles)")
    values: dict[Label, Annotated[Flags, BeforeValidator(lambda v: {} if v is None else v)]] = Field(
        min_length=1, description="label -> flags, one cell each, e.g. {mmap: {}, streamed: {--moe-stream: true}}")


def _axis_kind(v: object) -> str | None:
    if isinstance(v, BundleAxis) or isinstance(v, dict) and "name" in v and "flag" not in v:
        return "bundle axis"
    if isinstance(v, dict) and "flag" in v and "name" in v:
        return None
    return "flag axis"  # also with neither: its errors name the keys (a misspelt `flg:` gets a hint)


AxisSpec = Annotated[
    Annotated[FlagAxis, Tag("flag axis")] | Annotated[BundleAxis, Tag("bundle axis")],
    Discriminator(_axis_kind, custom_error_type="campaign", custom_error_message=(
        "needs exactly one of flag (vary one flag) or name (labelled flag bundles)"))]


class Precision(_Model):
    """After the minimum, whole rounds are added until every ratio to the base is precise, or the maximum."""

    ratio_half_width: float = Field(gt=0, lt=1, description=(
        "stop adding rounds once every cell's ratio to the base is known within +- this (0.05: 5%, at 99%)"))
    min_repeats: int | None = Field(None, ge=2, description="rounds always run (default: repeats)")
    max_repeats: int = Field(12, ge=2, description="rounds at most")


QUESTION = "{question}"  # where a question goes in a quality template


class QualitySpec(_Model):
    """Answer quality: every cell answers the same questions, greedy, in one engine process per run."""

    suite: Literal["gsm8k"] = Field("gsm8k", description="the question set (gsm8k: the GSM8K test split, shipped)")
    n: int | None = Field(None, ge=1, description="ask the first n questions of the split")
    ids: list[Annotated[int, Field(ge=0)]] | None = Field(
        None, min_length=1, description="or ask these questions (0-based lines of the split), in this order")
    template: str = Field(description="the prompt, with {question} where the question goes (the chat template, "
                                      "if --chatml, wraps it)")


SHORTHAND = ("target", "engine")  # keys whose value may be just their kind: `target: local`, `engine: bmoe`
# a part that takes exactly one of these keys: setting one (`--set model.path=...`) replaces the others
ONE_OF: dict[str, tuple[str, ...]] = {"model": ("path", "recipe", "push_from", "hf"),
                                     "engine": ("path", "push_from"), "fidelity": ("text", "text_file")}


def _shorthand(v: object) -> object:
    return {"kind": v} if isinstance(v, str) else v


class CampaignFile(_Model):
    name: Annotated[str, _check(r"[a-z0-9][a-z0-9_-]*", "{v!r} must be lower-case letters, digits, '-' or '_'")] = (
        Field(description="the campaign name, e.g. name: demo; the folder is bench-data/<date>-<name>/"))
    description: str = Field("", description="one paragraph: the question this campaign answers")
    model: ModelSource = Field(description="model: {path: FILE} or model: {recipe: {shape: tiny}}")
    target: Annotated[TargetSpec, BeforeValidator(_shorthand)] = Field(
        default_factory=TargetSpec, description="where to run: {kind: local|adb|ssh|termux, ...}, or just local")
    engine: Annotated[EngineSpec, BeforeValidator(_shorthand)] = Field(
        default_factory=EngineSpec, description="what to run: {kind: bmoe|external, path, push_from, args}")
    engines: dict[Label, Annotated[EngineEntry, BeforeValidator(_shorthand)]] | None = Field(None, description=(
        "instead of engine: label -> engine, an axis crossed with every cell (the first is the reference), "
        "e.g. {bmoe: bmoe, cxx: {kind: external, path: bmoe-cli, spell: {--cache-policy: null}}}"))
    flags: Flags = Field(default_factory=dict, description="base engine flags, e.g. {-t: 2, --moe-stream: true}")
    axes: list[AxisSpec] = Field(default_factory=list, description=(
        "one thing varied at a time: {flag: --x, values: [...]} or {name: x, values: {label: {flags}}}"))
    cells: list[Flags] = Field(default_factory=list, description=(
        "explicit cells: flag mappings, each differing from the base in one flag"))
    cross: bool = Field(False, description="true to run the full cross product of the axes instead")
    repeats: int = Field(3, ge=1, description="runs per cell (with precision: the fewest, unless min_repeats)")
    precision: Precision | None = Field(None, description=(
        "add rounds until the ratios are precise: {ratio_half_width: 0.05, min_repeats: 3, max_repeats: 12}"))
    tokens: int = Field(32, ge=1, description="tokens to generate per run")
    prompt: Annotated[str, _check(r"(?s).*\S.*", "is empty")] = Field(DEFAULT_PROMPT, description="prompt text")
    warmup_tokens: int = Field(0, ge=0, description="tokens trimmed from the start of each run before statistics")
    order: Literal["interleaved", "alternating", "random"] = Field(
        "alternating", description="run order: alternating reverses odd rounds, random is a seeded shuffle")
    seed: int = Field(0, ge=0, description="seed for random order and the bootstrap")
    cooldown: Cooldown = Field(default_factory=Cooldown, description="the gate before each run")
    timeout_s: float = Field(1800.0, ge=1, description="longest a single run may take")
    traces: bool = Field(False, description=(
        "true: every run writes its --io-trace and --compute-trace into its folder (io_trace.csv, "
        "compute_trace.csv; engine bmoe, cells with --moe-stream); the report draws one token's timeline. "
        "Tracing perturbs the timings a little"))
    quality: QualitySpec | None = Field(None, description=(
        "ask questions and grade the replies: {suite: gsm8k, n: 100, template: '...{question}...'}; tokens is "
        "then the longest reply"))
    fidelity: FidelitySpec | None = Field(None, description=(
        "score cells teacher-forced against a reference run: {text_file: ..., ctx: 128, cells: lossy}"))
    sample_text: int = Field(0, ge=0, le=4000, description="findings.md shows the first N characters each cell wrote")
    family: _FamilyName | None = Field(None, description=(
        "a name shared by campaigns asking one question of different models, with the same cell labels; "
        "`bmoe-bench report --all` writes reports/<family>.md across them, by model size"))
    targets: list[FleetTarget] | None = Field(None, min_length=1, description="a fleet: [{serial, server, label}]")
    fleet: FleetSpec | None = Field(None, description="a fleet's use (compare|spread), selector, device_grace_s")
    replicate: Replicate | None = Field(None, description=(
        "repeat the headline comparison as separate tries with waits between them, as MLPerf Mobile asks: "
        "{tries: 5, within_pct: 5, wait_s: 300}; findings and check say whether it replicated"))
    device_timeout_s: float | None = Field(None, ge=1, description=(
        "adb, ssh, termux and fleet targets: the longest one exchange with a device's server may take (default 30 "
        "s); `--device-timeout` overrides it. Not part of the plan: a folder resumes with another"))
    prepare: PrepareSpec | None = Field(None, description=(
        "adb devices: prepared before the runs and restored after (a journal in the folder's prepared/): "
        "{screen: turn_off, charger: unplug, battery_min_pct: 50, pin_cores: 4, governor: performance}"))

    def relation_problems(self) -> list[tuple[Loc, str]]:
        """Every rule between fields this file breaks, as (location, message)."""
        out = self._part_problems() + self._axis_problems() + self._quality_problems() + self._traces_problems()
        out += self._precision_problems() + self._fidelity_problems() + fleet_problems(self)
        if self.prepare is not None:
            adb = self.target.kind == "adb" or self.targets is not None or self.fleet is not None
            out += self.prepare.problems(adb)
        out += replicate_problems(self)
        if self.warmup_tokens >= self.tokens:
            out.append((("warmup_tokens",), f"warmup_tokens ({self.warmup_tokens}) must be less than tokens "
                                            f"({self.tokens}): nothing would be left to measure"))
        if self.engine.kind == "bmoe" or any(e.kind == "bmoe" for e in (self.engines or {}).values()):
            out += [(loc, f"{loc[0]}: {f} is set by the harness from '{BMOE_MANAGED[f]}'; remove it")
                    for loc, f in self._flag_uses() if f in BMOE_MANAGED]
        return out + self._engines_problems()

    def _engines_problems(self) -> list[tuple[Loc, str]]:
        if self.engines is None:
            return []
        out: list[tuple[Loc, str]] = []
        if "engine" in self.model_fields_set:
            out.append((("engines",), "give either engine (one engine) or engines (an axis of engines), not both"))
        if len(self.engines) < 2:
            out.append((("engines",), "engines needs at least two engines to compare; with one, use engine:"))
        for label, e in self.engines.items():
            loc: Loc = ("engines", label)
            if e.kind == "external" and (e.path is None) == (e.push_from is None):
                out.append((loc, f"engines.{label}: kind external needs exactly one of path or push_from"))
            if e.kind == "bmoe":
                out += [(loc + (k,), f"engines.{label}.{k} is for external engines") for k in ("path", "push_from")
                        if getattr(e, k) is not None]
                out += [(loc + (k,), f"engines.{label}.{k}: bmoe's flags are the campaign's own")
                        for k in ("args", "spell") if k in e.model_fields_set]
                if self.target.kind == "adb":
                    out.append((loc, f"engines.{label}: bmoe runs where Python runs (target local, ssh or termux)"))
            varied = {f for loc_, f in self._flag_uses() if loc_[0] in ("axes", "cells")}
            out += [(loc + ("flags", f), f"engines.{label}.flags: {f} is varied by the campaign; an engine's own "
                                         f"flags pin what the cells leave alone") for f in e.flags if f in varied]
            names = list(dict.fromkeys([f for _, f in self._flag_uses() if not _ == ("engines",)] + list(e.flags)))
            spelt: dict[str, str] = {}
            for f in names:
                to = e.spell.get(f, f)
                if to is not None and spelt.setdefault(to, f) != f:
                    out.append((loc + ("spell",), f"engines.{label}.spell: {spelt[to]} and {f} are both spelt {to}"))
        return out

    def _part_problems(self) -> list[tuple[Loc, str]]:
        m, t, e = self.model, self.target, self.engine
        out: list[tuple[Loc, str]] = []
        if [m.path, m.recipe, m.push_from, m.hf].count(None) != 3:
            out.append((("model",), "model needs exactly one of path (on the target), recipe (generated), "
                                    "push_from (a local file staged on the target) or hf (a hub model)"))
        if e.kind == "external" and (e.path is None) == (e.push_from is None):
            out.append((("engine",), "engine kind external needs exactly one of path (the executable on the "
                                     "target) or push_from (a local executable staged on the target)"))
        if e.kind == "bmoe":
            out += [(("engine", k), f"engine.{k} is for external engines; bmoe is the installed console script")
                    for k in ("path", "push_from") if getattr(e, k) is not None]
            if "args" in e.model_fields_set:
                out.append((("engine", "args"), "engine.args is for external engines; bmoe's flags are fixed"))
        if t.kind != "local" and (t.mem_cap_mib is not None or t.drop_caches):
            out.append((("target",), "mem_cap_mib and drop_caches apply to target local only"))
        out += ssh_problems(t)
        if t.kind == "adb":
            if e.kind == "bmoe" and self.engines is None:
                out.append((("engine",) if "engine" in self.model_fields_set else ("target",),
                            "engine bmoe runs where Python runs (target local, ssh or termux); over adb use "
                            "engine: {kind: external, path: /data/local/tmp/bmoe/bmoe-cli}"))
            if m.recipe is not None:
                out.append((("model",), "a model recipe generates a local file: use target local, or give the "
                                        "model's path on the device"))
        return out

    def min_repeats(self) -> int:  # rounds always run: precision.min_repeats, else repeats
        p = self.precision
        return p.min_repeats if p is not None and p.min_repeats is not None else self.repeats

    def _precision_problems(self) -> list[tuple[Loc, str]]:
        p, n = self.precision, self.min_repeats()
        if p is None:
            return []
        out: list[tuple[Loc, str]] = [(("precision", "min_repeats"), f"precision.min_repeats ({p.min_repeats}) and "
                                       f"repeats ({self.repeats}) disagree: give one of them")] \
            if p.min_repeats not in (None, self.repeats) and "repeats" in self.model_fields_set else []
        if n < 2:
            out.append((("precision",), f"precision needs at least 2 rounds before its first check, got {n} "
                                        f"(repeats or precision.min_repeats)"))
        if p.max_repeats < n:
            out.append((("precision", "max_repeats"), f"precision.max_repeats ({p.max_repeats}) is below the "
                                                      f"minimum ({n} rounds)"))
        if self.quality is not None:
            out.append((("precision",), "precision: a quality campaign's figure is its grades; set repeats"))
        return out

    def _fidelity_problems(self) -> list[tuple[Loc, str]]:
        if self.fidelity is None:
            return []
        kinds = {e.kind for e in self.engines.values()} if self.engines else {self.engine.kind}
        out = self.fidelity.problems()
        if kinds != {"bmoe"} and not self.fidelity.python_engine:
            out.append((("fidelity",), "fidelity: the C++ engine (bmoe-cli) has no logits output, so an external "
                                       "engine cannot be scored; use engine bmoe, or over adb an external engine "
                                       "that runs the Python engine with fidelity.python_engine: true"))
        return out

    def _traces_problems(self) -> list[tuple[Loc, str]]:
        kinds = {e.kind for e in self.engines.values()} if self.engines else {self.engine.kind}
        if self.traces and kinds != {"bmoe"}:
            return [(("traces",), "traces: only engine bmoe writes --io-trace and --compute-trace")]
        return []

    def _quality_problems(self) -> list[tuple[Loc, str]]:
        q = self.quality
        if q is None:
            return []
        out: list[tuple[Loc, str]] = []
        if (q.n is None) == (q.ids is None):
            out.append((("quality",), "quality needs exactly one of n (the first n questions) or ids (a list)"))
        if q.ids is not None and len(set(q.ids)) != len(q.ids):
            out.append((("quality", "ids"), "quality.ids: a question is listed twice"))
        if q.template.count(QUESTION) != 1:
            out.append((("quality", "template"), f"quality.template must contain {QUESTION} exactly once"))
        if self.engine.kind != "bmoe":
            out.append((("quality",), "quality campaigns need engine bmoe (its --prompts-file mode answers "
                                      "every question in one process)"))
        return out

    def _axis_problems(self) -> list[tuple[Loc, str]]:
        out: list[tuple[Loc, str]] = []
        seen: set[str] = set()
        for i, ax in enumerate(self.axes):
            key = "flag" if isinstance(ax, FlagAxis) else "name"
            ident = getattr(ax, key)
            if ident in seen:
                out.append((("axes", i, key), f"axes: {ident} appears twice; put all its values in one axis"))
            seen.add(ident)
            if isinstance(ax, FlagAxis):
                out += [(("axes", i, "values", j), f"axes {ax.flag}: value {v!r} is listed twice")
                        for j, v in enumerate(ax.values) if any(w == v and type(w) is type(v) for w in ax.values[:j])]
        return out

    def _flag_uses(self) -> list[tuple[Loc, str]]:
        """(location, flag) of every flag the file sets: base, axes, explicit cells."""
        uses: list[tuple[Loc, str]] = [(("flags", f), f) for f in self.flags]
        for i, ax in enumerate(self.axes):
            if isinstance(ax, FlagAxis):
                uses.append((("axes", i, "flag"), ax.flag))
            else:
                uses += [(("axes", i, "values", label, f), f) for label, fl in ax.values.items() for f in fl]
        uses += [(("cells", i, f), f) for i, fl in enumerate(self.cells) for f in fl]
        uses += [(("engines", label, "flags", f), f) for label, e in (self.engines or {}).items()
                 if e.kind == "bmoe" for f in e.flags]
        return uses
