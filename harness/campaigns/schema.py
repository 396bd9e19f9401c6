"""The campaign file: its schema, and `load_campaign(path)` which checks it and returns a `Campaign`.

Every problem is reported as `file:line: message` (all of them at once, via CampaignError). Checks that
need the cells (one axis at a time, flags the engine would refuse) live in `validate.py`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from harness.campaigns.yamlsrc import Problems, compose_file, mapping_items, scalar, type_name

FlagValue = bool | int | float | str | None

ORDERS = ("interleaved", "alternating", "random")
TARGET_KINDS = ("local", "adb")
ENGINE_KINDS = ("bmoe", "external")

# how the harness passes what it owns to the engine; an external engine may spell these differently
DEFAULT_IO_ARGS = {"model": "-m", "prompt": "-p", "tokens": "-n", "csv": "--csv", "progress": "--progress"}
# every spelling of a flag the harness sets itself (for the `bmoe` engine), so campaigns cannot set them
BMOE_MANAGED = {"-m": "model", "--model": "model", "-p": "prompt", "--prompt": "prompt", "-n": "tokens",
                "--n-predict": "tokens", "--csv": "csv", "--progress": "progress"}

RECIPE_INT = ("n_layer", "n_expert", "n_expert_used", "n_embd", "n_ff_exp", "n_ff_shexp", "n_ff", "n_head",
              "n_head_kv", "head_dim", "n_vocab", "ctx_len", "seed", "n_split")
RECIPE_STR = ("shape", "arch", "expert_type", "dense_type", "vocab_type")

TOP_KEYS = {
    "name": "campaign name ([a-z0-9_-], used in the bench-data folder name)",
    "description": "one paragraph: the question this campaign answers",
    "model": "path: FILE, or recipe: {shape: ..., ...} to generate one",
    "target": "kind: local|adb, serial, mem_cap_mib, drop_caches, evict_model",
    "engine": "kind: bmoe|external, path, push_from, args",
    "flags": "base engine flags, e.g. {-t: 2, --moe-stream: true}",
    "axes": "list of {flag: --x, values: [...]} or {name: x, values: {label: {flags}}}: one at a time",
    "cells": "explicit cells: list of flag mappings, each differing from the base in one flag",
    "cross": "true to run the full cross product of the axes",
    "repeats": "runs per cell",
    "tokens": "tokens to generate per run",
    "prompt": "prompt text",
    "warmup_tokens": "tokens trimmed from the start of each run before statistics",
    "order": f"run order: {', '.join(ORDERS)}",
    "seed": "seed for random order and the bootstrap",
    "cooldown": "gate before each run: cpu_temp_max_c, mem_available_min_mib, max_wait_s",
    "timeout_s": "longest a single run may take",
}
MODEL_KEYS = {"path": "model file on the target", "recipe": "make-model recipe",
              "push_from": "local model file to stage on the target (adb: pushed once, checked by size+hash)"}
TARGET_KEYS = {"kind": "local or adb", "serial": "adb serial", "mem_cap_mib": "local memory cap (cgroup)",
               "drop_caches": "drop the page cache before each run (local, root)",
               "evict_model": "evict the model file from the page cache before each run (local, default true)"}
ENGINE_KEYS = {"kind": "bmoe or external", "path": "engine executable (on the target)",
               "push_from": "local engine binary to stage on the target (adb: pushed once)",
               "args": "how the engine spells model/prompt/..."}
COOLDOWN_KEYS = {"cpu_temp_max_c": "CPU temperature ceiling", "mem_available_min_mib": "MemAvailable floor",
                 "max_wait_s": "longest wait before giving up", "poll_s": "seconds between checks"}
AXIS_KEYS = {"flag": "engine flag (a flag axis)", "name": "axis name (an axis of labelled flag bundles)",
             "values": "list of values, or label -> flags for a named axis"}


@dataclass(frozen=True)
class ModelSource:
    path: str | None = None
    recipe: dict[str, object] | None = None
    push_from: str | None = None


@dataclass(frozen=True)
class TargetSpec:
    kind: str = "local"
    serial: str | None = None
    mem_cap_mib: int | None = None
    drop_caches: bool = False
    evict_model: bool = True  # posix_fadvise(DONTNEED) on the model file(s) before each run (local)


@dataclass(frozen=True)
class EngineSpec:
    kind: str = "bmoe"
    path: str | None = None
    push_from: str | None = None
    args: dict[str, str | None] = field(default_factory=lambda: dict(DEFAULT_IO_ARGS))


@dataclass(frozen=True)
class Cooldown:
    cpu_temp_max_c: float | None = None
    mem_available_min_mib: int | None = None
    max_wait_s: float = 300.0
    poll_s: float = 2.0


@dataclass(frozen=True)
class AxisValue:
    label: str  # "--cache-mb=64" for a flag axis, the bundle's own label for a named axis
    flags: dict[str, FlagValue]
    line: int


@dataclass(frozen=True)
class Axis:
    name: str  # the flag of a flag axis, or the name of a bundle axis
    values: tuple[AxisValue, ...]
    is_flag: bool = True

    @property
    def flag(self) -> str:
        return self.name

    @property
    def lines(self) -> tuple[int, ...]:
        return tuple(v.line for v in self.values)


@dataclass(frozen=True)
class ExplicitCell:
    flags: dict[str, FlagValue]
    line: int


@dataclass(frozen=True)
class Campaign:
    name: str
    source: str  # the path as the user gave it (for messages and the reproduce command)
    base_dir: str  # folder of the campaign file: relative model/engine paths resolve against it
    model: ModelSource
    target: TargetSpec
    engine: EngineSpec
    flags: dict[str, FlagValue]
    axes: tuple[Axis, ...] = ()
    cells: tuple[ExplicitCell, ...] = ()
    cross: bool = False
    repeats: int = 3
    tokens: int = 32
    prompt: str = "Explain how a mixture-of-experts model decides which experts handle each token."
    warmup_tokens: int = 0
    order: str = "alternating"
    seed: int = 0
    cooldown: Cooldown = field(default_factory=Cooldown)
    timeout_s: float = 1800.0
    description: str = ""
    flags_line: int = 1
    lines: dict[str, int] = field(default_factory=dict)  # top-level key -> line

    def resolve_local(self, p: str) -> Path:
        q = Path(p).expanduser()
        return q if q.is_absolute() else Path(self.base_dir) / q


_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


class _Reader:
    """Typed reads of scalar nodes that record problems instead of raising."""

    def __init__(self, probs: Problems):
        self.probs = probs

    def get(self, items: dict[str, yaml.Node], key: str, where: str, kinds: tuple[type, ...], default: object,
            *, nullable: bool = False, minimum: float | None = None) -> object:
        node = items.get(key)
        if node is None:
            return default
        want = " or ".join({int: "an integer", float: "a number", str: "a string", bool: "a boolean"}[k]
                           for k in kinds)
        if not isinstance(node, yaml.ScalarNode):
            self.probs.add(node, f"{where}{key} must be {want}, got {type_name(node)}")
            return default
        v = scalar(node)
        if v is None and nullable:
            return None
        ok = isinstance(v, kinds) and not (isinstance(v, bool) and bool not in kinds)
        if float in kinds and isinstance(v, int) and not isinstance(v, bool):
            v, ok = float(v), True
        if not ok:
            self.probs.add(node, f"{where}{key} must be {want}{' or null' if nullable else ''}, got "
                                 f"{type_name(node)} {node.value!r}")
            return default
        if minimum is not None and v < minimum:
            self.probs.add(node, f"{where}{key} must be >= {minimum:g}, got {v}")
            return default
        return v

    def choice(self, items: dict[str, yaml.Node], key: str, where: str, choices: tuple[str, ...], default: str
               ) -> str:
        v = self.get(items, key, where, (str,), default)
        if v not in choices:
            self.probs.add(items[key], f"{where}{key} must be one of {', '.join(choices)}, got {v!r}")
            return default
        return str(v)


def _flag_value(node: yaml.Node, probs: Problems, where: str) -> tuple[bool, FlagValue]:
    if not isinstance(node, yaml.ScalarNode):
        probs.add(node, f"{where} must be a single value (string, number, true/false), got {type_name(node)}")
        return False, None
    v = scalar(node)
    if not isinstance(v, bool | int | float | str | type(None)):
        probs.add(node, f"{where}: unsupported value {node.value!r}")
        return False, None
    return True, v  # type: ignore[return-value]


def _flag_map(node: yaml.Node, probs: Problems, where: str) -> dict[str, FlagValue]:
    if not isinstance(node, yaml.MappingNode):
        probs.add(node, f"{where} must be a mapping of engine flags to values, got {type_name(node)}")
        return {}
    out: dict[str, FlagValue] = {}
    for k, v in node.value:
        name = scalar(k) if isinstance(k, yaml.ScalarNode) else None
        if not isinstance(name, str) or not _flag_ok(name):
            probs.add(k, f"{where}: {k.value!r} is not an engine flag; write it as the engine does, "
                         f"e.g. -t or --cache-mb")
            continue
        if name in out:
            probs.add(k, f"duplicate flag {name!r} in {where}")
            continue
        ok, val = _flag_value(v, probs, f"{where} {name}")
        if ok:
            out[name] = val
    return out


def _flag_ok(name: str) -> bool:
    return bool(re.fullmatch(r"-[A-Za-z]|--[A-Za-z0-9][A-Za-z0-9_-]*", name))


def load_campaign(path: Path | str) -> Campaign:
    """Parse and type-check a campaign file. Raises CampaignError listing every problem."""
    shown = str(path)
    path = Path(path)
    root = compose_file(path, shown)
    probs = Problems(shown)
    r = _Reader(probs)
    top = mapping_items(root, TOP_KEYS, "the campaign", probs)
    if top is None:
        probs.raise_if_any()
        raise AssertionError("unreachable")
    lines = {k: n.start_mark.line + 1 for k, n in top.items()}

    name = r.get(top, "name", "", (str,), "")
    if "name" not in top:
        probs.add(root, "missing key 'name' (the campaign name, e.g. name: demo)")
    elif not _NAME_RE.match(str(name)):
        probs.add(top["name"], f"name {name!r} must be lower-case letters, digits, '-' or '_'")

    model = _model(top.get("model"), root, probs, r)
    target = _target(top.get("target"), probs, r)
    engine = _engine(top.get("engine"), probs, r)
    flags = _flag_map(top["flags"], probs, "flags") if "flags" in top else {}
    axes = _axes(top.get("axes"), probs)
    cells = _cells(top.get("cells"), probs)
    cooldown = _cooldown(top.get("cooldown"), probs, r)

    repeats = int(r.get(top, "repeats", "", (int,), 3, minimum=1))  # type: ignore[arg-type]
    tokens = int(r.get(top, "tokens", "", (int,), 32, minimum=1))  # type: ignore[arg-type]
    warmup = int(r.get(top, "warmup_tokens", "", (int,), 0, minimum=0))  # type: ignore[arg-type]
    if warmup >= tokens and "warmup_tokens" in top:
        probs.add(top["warmup_tokens"], f"warmup_tokens ({warmup}) must be less than tokens ({tokens}): "
                                        f"nothing would be left to measure")
    prompt = r.get(top, "prompt", "", (str,), Campaign.prompt)
    if "prompt" in top and not str(prompt).strip():
        probs.add(top["prompt"], "prompt is empty")

    if engine.kind == "bmoe":
        for f in flags:
            if f in BMOE_MANAGED:
                probs.add(top["flags"], f"flags: {f} is set by the harness from '{BMOE_MANAGED[f]}'; remove it")
        for ax in axes:
            for v in ax.values:
                for f in v.flags:
                    if f in BMOE_MANAGED:
                        probs.items.append((v.line, f"axes: {f} is set by the harness from '{BMOE_MANAGED[f]}'"))
    if target.kind == "adb" and engine.kind == "bmoe":
        probs.add(top.get("engine") or top.get("target"),
                  "engine bmoe runs where Python runs (target local); on a phone use "
                  "engine: {kind: external, path: /data/local/tmp/bmoe/bmoe-cli}")
    if target.kind == "adb" and (target.mem_cap_mib is not None or target.drop_caches):
        probs.add(top["target"], "mem_cap_mib and drop_caches apply to target local only")
    if model.recipe is not None and target.kind == "adb":
        probs.add(top["model"], "a model recipe generates a local file: use target local, or give the "
                                "model's path on the device")

    cross = bool(r.get(top, "cross", "", (bool,), False))
    order = r.choice(top, "order", "", ORDERS, "alternating")
    seed = int(r.get(top, "seed", "", (int,), 0, minimum=0))  # type: ignore[arg-type]
    timeout_s = float(r.get(top, "timeout_s", "", (float,), 1800.0, minimum=1))  # type: ignore[arg-type]
    description = str(r.get(top, "description", "", (str,), ""))
    probs.raise_if_any()
    return Campaign(
        name=str(name), source=shown, base_dir=str(path.parent), model=model, target=target, engine=engine,
        flags=flags, axes=tuple(axes), cells=tuple(cells), cross=cross,
        repeats=repeats, tokens=tokens, prompt=str(prompt), warmup_tokens=warmup, order=order, seed=seed,
        cooldown=cooldown, timeout_s=timeout_s, description=description,
        flags_line=lines.get("flags", 1), lines=lines,
    )


def _model(node: yaml.Node | None, root: yaml.Node, probs: Problems, r: _Reader) -> ModelSource:
    if node is None:
        probs.add(root, "missing key 'model' (model: {path: FILE} or model: {recipe: {shape: tiny}})")
        return ModelSource()
    items = mapping_items(node, MODEL_KEYS, "model", probs)
    if items is None:
        return ModelSource()
    path = r.get(items, "path", "model.", (str,), None)
    push = r.get(items, "push_from", "model.", (str,), None)
    recipe: dict[str, object] | None = None
    if "recipe" in items:
        rn = items["recipe"]
        allowed = {k: "" for k in RECIPE_STR + RECIPE_INT}
        ri = mapping_items(rn, allowed, "model.recipe", probs)
        if ri is not None:
            recipe = {}
            for k in ri:
                kinds: tuple[type, ...] = (str,) if k in RECIPE_STR else (int,)
                v = r.get(ri, k, "model.recipe.", kinds, None)
                if v is not None:
                    recipe[k] = v
            recipe_problem = _check_recipe(recipe)
            if recipe_problem:
                probs.add(rn, f"model.recipe: {recipe_problem}")
    if [path, recipe, push].count(None) != 2:
        probs.add(node, "model needs exactly one of path (on the target), recipe (generated) or "
                        "push_from (a local file staged on the target)")
    return ModelSource(path=path, recipe=recipe, push_from=push)  # type: ignore[arg-type]


def _check_recipe(recipe: dict[str, object]) -> str | None:
    from harness.campaigns.recipe import recipe_spec
    from harness.errors import UserError

    try:
        recipe_spec(recipe)
    except UserError as e:
        return str(e)
    return None


def _target(node: yaml.Node | None, probs: Problems, r: _Reader) -> TargetSpec:
    if node is None:
        return TargetSpec()
    if isinstance(node, yaml.ScalarNode):  # `target: local` shorthand
        kind = scalar(node)
        if kind not in TARGET_KINDS:
            probs.add(node, f"target must be one of {', '.join(TARGET_KINDS)} or a mapping, got {node.value!r}")
            return TargetSpec()
        return TargetSpec(kind=str(kind))
    items = mapping_items(node, TARGET_KEYS, "target", probs)
    if items is None:
        return TargetSpec()
    cap = r.get(items, "mem_cap_mib", "target.", (int,), None, nullable=True, minimum=16)
    return TargetSpec(
        kind=r.choice(items, "kind", "target.", TARGET_KINDS, "local"),
        serial=r.get(items, "serial", "target.", (str,), None, nullable=True),  # type: ignore[arg-type]
        mem_cap_mib=cap,  # type: ignore[arg-type]
        drop_caches=bool(r.get(items, "drop_caches", "target.", (bool,), False)),
        evict_model=bool(r.get(items, "evict_model", "target.", (bool,), True)),
    )


def _engine(node: yaml.Node | None, probs: Problems, r: _Reader) -> EngineSpec:
    if node is None:
        return EngineSpec()
    if isinstance(node, yaml.ScalarNode) and scalar(node) == "bmoe":
        return EngineSpec()
    items = mapping_items(node, ENGINE_KEYS, "engine", probs)
    if items is None:
        return EngineSpec()
    kind = r.choice(items, "kind", "engine.", ENGINE_KINDS, "bmoe")
    path = r.get(items, "path", "engine.", (str,), None)
    if kind == "external" and (path is None) == ("push_from" not in items):
        probs.add(node, "engine kind external needs exactly one of path (the executable on the target) or "
                        "push_from (a local executable staged on the target)")
    if kind == "bmoe" and path is not None:
        probs.add(items["path"], "engine.path is for external engines; bmoe is the installed console script")
    args = dict(DEFAULT_IO_ARGS)
    if "args" in items:
        ai = mapping_items(items["args"], {k: "" for k in DEFAULT_IO_ARGS}, "engine.args", probs)
        for k in ai or {}:
            v = r.get(ai, k, "engine.args.", (str,), args[k], nullable=(k == "progress"))  # type: ignore[arg-type]
            if v is not None and not _flag_ok(str(v)):
                probs.add(ai[k], f"engine.args.{k}: {v!r} is not a flag")  # type: ignore[index]
            args[k] = v  # type: ignore[assignment]
        if kind == "bmoe":
            probs.add(items["args"], "engine.args is for external engines; bmoe's flags are fixed")
    return EngineSpec(kind=kind, path=path,  # type: ignore[arg-type]
                      push_from=r.get(items, "push_from", "engine.", (str,), None), args=args)  # type: ignore[arg-type]


def _cooldown(node: yaml.Node | None, probs: Problems, r: _Reader) -> Cooldown:
    if node is None:
        return Cooldown()
    items = mapping_items(node, COOLDOWN_KEYS, "cooldown", probs)
    if items is None:
        return Cooldown()
    return Cooldown(
        cpu_temp_max_c=r.get(items, "cpu_temp_max_c", "cooldown.", (float,), None, nullable=True),  # type: ignore[arg-type]
        mem_available_min_mib=r.get(items, "mem_available_min_mib", "cooldown.", (int,), None,  # type: ignore[arg-type]
                                    nullable=True, minimum=0),
        max_wait_s=float(r.get(items, "max_wait_s", "cooldown.", (float,), 300.0, minimum=0)),  # type: ignore[arg-type]
        poll_s=float(r.get(items, "poll_s", "cooldown.", (float,), 2.0, minimum=0.1)),  # type: ignore[arg-type]
    )


def _axes(node: yaml.Node | None, probs: Problems) -> list[Axis]:
    if node is None:
        return []
    if not isinstance(node, yaml.SequenceNode):
        probs.add(node, f"axes must be a list of {{flag: --x, values: [...]}}, got {type_name(node)}")
        return []
    out: list[Axis] = []
    seen: set[str] = set()
    for an in node.value:
        items = mapping_items(an, AXIS_KEYS, "axes entry", probs)
        if items is None:
            continue
        fn, nn, vn = items.get("flag"), items.get("name"), items.get("values")
        if (fn is None) == (nn is None) or vn is None:
            probs.add(an, "an axis needs values and exactly one of flag (vary one flag) or name (labelled "
                          "flag bundles)")
            continue
        key = fn if fn is not None else nn
        ident = scalar(key) if isinstance(key, yaml.ScalarNode) else None
        if fn is not None and (not isinstance(ident, str) or not _flag_ok(ident)):
            probs.add(fn, f"axes: {getattr(fn, 'value', '?')!r} is not an engine flag (e.g. --cache-mb)")
            continue
        if not isinstance(ident, str) or not ident:
            probs.add(key, "axes: name must be a string")
            continue
        if ident in seen:
            probs.add(key, f"axes: {ident} appears twice; put all its values in one axis")
            continue
        seen.add(ident)
        ax = _flag_axis(ident, vn, probs) if fn is not None else _bundle_axis(ident, vn, probs)
        if ax is not None:
            out.append(ax)
    return out


def _flag_axis(flag: str, vn: yaml.Node, probs: Problems) -> Axis | None:
    from harness.campaigns.expand import render_value

    if not isinstance(vn, yaml.SequenceNode) or not vn.value:
        probs.add(vn, f"axes {flag}: values must be a non-empty list, got {type_name(vn)}")
        return None
    vals: list[AxisValue] = []
    for v in vn.value:
        ok, val = _flag_value(v, probs, f"axes {flag} value")
        if not ok:
            continue
        if any(x.flags[flag] == val and type(x.flags[flag]) is type(val) for x in vals):
            probs.add(v, f"axes {flag}: value {v.value!r} is listed twice")
            continue
        vals.append(AxisValue(label=f"{flag}={render_value(val)}", flags={flag: val}, line=v.start_mark.line + 1))
    return Axis(name=flag, values=tuple(vals), is_flag=True)


def _bundle_axis(name: str, vn: yaml.Node, probs: Problems) -> Axis | None:
    if not isinstance(vn, yaml.MappingNode) or not vn.value:
        probs.add(vn, f"axes {name}: values must be a mapping of label -> flags, e.g. "
                      f"{{mmap: {{}}, streamed: {{--moe-stream: true}}}}, got {type_name(vn)}")
        return None
    vals: list[AxisValue] = []
    for k, v in vn.value:
        label = scalar(k) if isinstance(k, yaml.ScalarNode) else None
        if not isinstance(label, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+-]*", label):
            probs.add(k, f"axes {name}: label {getattr(k, 'value', '?')!r} must be a word (letters, digits, "
                         f"_ . + -)")
            continue
        if any(x.label == label for x in vals):
            probs.add(k, f"axes {name}: label {label!r} is listed twice")
            continue
        flags = {} if isinstance(v, yaml.ScalarNode) and scalar(v) is None else \
            _flag_map(v, probs, f"axes {name} {label}")
        vals.append(AxisValue(label=label, flags=flags, line=k.start_mark.line + 1))
    return Axis(name=name, values=tuple(vals), is_flag=False)


def _cells(node: yaml.Node | None, probs: Problems) -> list[ExplicitCell]:
    if node is None:
        return []
    if not isinstance(node, yaml.SequenceNode):
        probs.add(node, f"cells must be a list of flag mappings, got {type_name(node)}")
        return []
    return [ExplicitCell(flags=_flag_map(cn, probs, "cells entry"), line=cn.start_mark.line + 1)
            for cn in node.value]
