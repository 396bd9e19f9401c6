"""`load_campaign(path)`: a campaign file read into a `Campaign`, or CampaignError listing every problem
as `file:line: message`.

The file's keys, types and help are declared once, in `harness.formats.campaign`; this module maps
pydantic's errors back to YAML lines and names. Checks that need the cells (one axis at a time, flags
the engine would refuse) live in `validate.py`."""

from __future__ import annotations

import difflib
import os
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Union, get_args, get_origin, get_type_hints

from pydantic import BaseModel, Field, Tag, ValidationError
from pydantic_core import ErrorDetails

from harness.campaigns.overrides import apply_overrides
from harness.campaigns.recipe import recipe_spec
from harness.campaigns.yamlsrc import CampaignError, Document, Loc, Where, loc_name, place, read_document, type_name
from harness.errors import UserError
from harness.formats.campaign import (
    BundleAxis,
    CampaignFile,
    EngineEntry,
    EngineSpec,
    FlagAxis,
    FlagValue,
    render_value,
)
from harness.formats.campaign import Cooldown as Cooldown  # re-exported: gate.py and tests import it from here


@dataclass(frozen=True)
class AxisValue:
    label: str  # "--cache-mb=64" for a flag axis, the bundle's own label for a named axis
    flags: dict[str, FlagValue]
    line: Where


@dataclass(frozen=True)
class Axis:
    name: str  # the flag of a flag axis, or the name of a bundle axis
    values: tuple[AxisValue, ...]
    is_flag: bool = True

    @property
    def flag(self) -> str:
        return self.name

    @property
    def lines(self) -> tuple[Where, ...]:
        return tuple(v.line for v in self.values)


@dataclass(frozen=True)
class ExplicitCell:
    flags: dict[str, FlagValue]
    line: Where


class Campaign(CampaignFile):
    """A loaded campaign file: its fields, where it came from, and the line of each part. `axes` and
    `cells` are the file's, as labelled values with the line each came from."""

    axes: tuple[Axis, ...] = ()  # type: ignore[assignment]
    cells: tuple[ExplicitCell, ...] = ()  # type: ignore[assignment]
    source: str = ""  # the path as the user gave it (for messages and the reproduce command)
    base_dir: str = ""  # folder of the campaign file: relative model/engine paths resolve against it
    lines: dict[str, Where] = Field(default_factory=dict)  # top-level key -> its line (or its last --set)
    overrides: tuple[str, ...] = ()  # the `--set KEY=VALUE` arguments applied to the file, as given

    @property
    def flags_line(self) -> Where:
        return self.lines.get("flags", 1)

    def place(self, where: Where) -> str:
        """`file:line`, or the `--set` argument, for a message."""
        return place(self.source, where)

    def engine_labels(self) -> list[str]:
        """The labels of the engines axis, the reference first; [""] for a campaign with one engine."""
        return list(self.engines) if self.engines else [""]

    def engine_of(self, label: str) -> EngineSpec | EngineEntry:
        """The engine of a cell: `engines[label]`, or the campaign's one `engine` for label ""."""
        return self.engines[label] if label and self.engines else self.engine

    def resolve_local(self, p: str) -> Path:
        q = Path(p).expanduser()
        return q if q.is_absolute() else Path(self.base_dir) / q


def load_campaign(path: Path | str, overrides: list[str] | tuple[str, ...] = ()) -> Campaign:
    """Parse and type-check a campaign file, with `--set KEY=VALUE` overrides applied first (see
    harness.campaigns.overrides). Raises CampaignError listing every problem."""
    shown = str(path)
    path = Path(path)
    doc = read_document(path, shown)
    apply_overrides(doc, overrides)
    doc.problems += unpassable_strings(doc.data, (), doc)
    if isinstance(doc.data, dict) and ("targets" in doc.data or "fleet" in doc.data) and "target" not in doc.data:
        doc.data["target"] = {"kind": "adb"}  # a fleet's devices are adb devices
    try:
        spec = CampaignFile.model_validate(doc.data)
    except ValidationError as e:
        raise CampaignError.at(shown, doc.problems + [_explain(err, doc) for err in e.errors()]) from None
    problems = doc.problems + [(doc.line(loc), msg) for loc, msg in spec.relation_problems() + _recipe_problems(spec)]
    if problems:
        raise CampaignError.at(shown, problems)
    axes = tuple(_axis(ax, ("axes", i), doc) for i, ax in enumerate(spec.axes))
    cells = tuple(ExplicitCell(flags=dict(f), line=doc.line(("cells", i))) for i, f in enumerate(spec.cells))
    fields = {k: getattr(spec, k) for k in CampaignFile.model_fields}
    return Campaign.model_construct(**{**fields, "axes": axes, "cells": cells}, source=shown,
                                    base_dir=str(path.parent), lines={str(k): doc.top(str(k)) for k in doc.data},
                                    overrides=tuple(overrides))


def _unpassable(text: str) -> str | None:
    """Why a string cannot become a process argument or a path (a NUL byte; a lone surrogate), or None."""
    if "\0" in text:
        return "a NUL byte (\\0)"
    try:
        os.fsencode(text)
    except UnicodeEncodeError as e:
        return f"the character U+{ord(text[e.start]):04X}, which has no bytes in the file system's encoding"
    return None


def unpassable_strings(data: object, loc: Loc, doc: Document) -> list[tuple[Where, str]]:
    """Every key and string value that could not be passed to the engine (prompts, flag values, paths and the
    quality template all become argv elements or paths: a NUL byte would stop the run at its first start)."""
    out: list[tuple[Where, str]] = []
    if isinstance(data, dict):
        for k, v in data.items():
            if isinstance(k, str) and (why := _unpassable(k)):
                out.append((doc.line(loc + (k,), key=True), f"a key of {loc_name(loc)} contains {why}; remove it"))
            out += unpassable_strings(v, loc + (k,), doc)
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out += unpassable_strings(v, loc + (i,), doc)
    elif isinstance(data, str) and (why := _unpassable(data)):
        out.append((doc.line(loc, key=True), f"{loc_name(loc)} contains {why}: it cannot be passed to a "
                    "process or be part of a path; remove it"))
    return out


def _axis(ax: FlagAxis | BundleAxis, loc: Loc, doc: Document) -> Axis:
    if isinstance(ax, FlagAxis):
        return Axis(name=ax.flag, values=tuple(
            AxisValue(label=f"{ax.flag}={render_value(v)}", flags={ax.flag: v}, line=doc.line(loc + ("values", j)))
            for j, v in enumerate(ax.values)))
    return Axis(name=ax.name, is_flag=False, values=tuple(
        AxisValue(label=label, flags=dict(flags), line=doc.line(loc + ("values", label), key=True))
        for label, flags in ax.values.items()))


def _recipe_problems(spec: CampaignFile) -> list[tuple[Loc, str]]:
    if spec.model.recipe is None:
        return []
    try:
        recipe_spec(dict(spec.model.recipe))
    except UserError as e:
        return [(("model", "recipe"), f"model.recipe: {e}")]
    return []


# ---- a pydantic error as one line: where, what it must be, what it got ----

def _explain(err: ErrorDetails, doc: Document) -> tuple[Where, str]:
    loc, parent, ann, is_key = _resolve(err["loc"])
    kind, where = err["type"], loc_name(loc)
    inside = "" if len(loc) == 1 else f" in {loc_name(loc[:-1])}"
    if kind == "extra_forbidden":
        known = list(_fields(parent))
        close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(known)}"
        return doc.line(loc, key=True), f"unknown key {loc[-1]!r}{inside} ({hint})"
    if kind == "missing":
        return doc.line(loc), f"missing key {loc[-1]!r}{inside} ({_fields(parent)[str(loc[-1])]})"
    if is_key:
        return doc.line(loc, key=True), f"{loc_name(loc[:-1])}: {err['msg']}"
    text, value = doc.texts.get(loc), err["input"]
    if kind == "literal_error" or kind.endswith("_type"):
        got = repr(text or value) if kind == "literal_error" and isinstance(value, str) else _got(value, text)
        want = _want(kind, ann)
        known = _fields(parent).get(str(loc[-1]), "") if loc and want.startswith(("a list", "a mapping")) else ""
        return doc.line(loc), f"{where} must be {want}, got {got}" + (f" ({known})" if known else "")
    if kind == "greater_than_equal":
        return doc.line(loc), f"{where} must be >= {err['ctx']['ge']:g}, got {text or value}"
    if kind in ("too_short", "string_too_short"):
        return doc.line(loc), f"{where} must not be empty"
    return doc.line(loc), f"{where} {err['msg']}" if kind == "campaign" else f"{where}: {err['msg']}"


def _got(value: object, text: str | None) -> str:
    if value is None or isinstance(value, dict | list):
        return type_name(value)
    return f"{type_name(value)} {text if text is not None else str(value)!r}"


def _resolve(raw: tuple[str | int, ...]) -> tuple[Loc, object, object, bool]:
    """pydantic's error location -> (the location in the file, the type holding its last part, its
    type, whether the error is about a mapping key). Union tags in the location are dropped."""
    ann: object = CampaignFile
    parent: object = None
    loc: list[str | int] = []
    is_key = False
    for part in raw:
        ann = _bare(ann)
        if part == "[key]":
            is_key = True
            continue
        if _is_union(ann):  # a tagged union: the part is the tag of the member it tried
            ann = next(m for m in get_args(ann) if any(isinstance(x, Tag) and x.tag == part for x in get_args(m)))
            continue
        parent = ann
        ann = get_args(ann)[-1] if get_origin(ann) in (dict, list) else _types(ann).get(str(part))
        loc.append(part)
    return tuple(loc), parent, ann, is_key


def _types(cls: object) -> dict[str, object]:
    """A model's or TypedDict's keys -> their types."""
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        return {k: f.annotation for k, f in cls.model_fields.items()}
    return get_type_hints(cls, include_extras=True) if isinstance(cls, type) else {}


def _fields(cls: object) -> dict[str, str]:
    """A model's or TypedDict's keys -> their help."""
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        return {k: f.description or "" for k, f in cls.model_fields.items()}
    return dict.fromkeys(_types(cls), "")


def _is_union(ann: object) -> bool:
    return get_origin(ann) in (Union, types.UnionType)


def _bare(ann: object) -> object:
    """`ann` without Annotated[...] and without `| None`."""
    while True:
        if get_origin(ann) is Annotated:
            ann = get_args(ann)[0]
        elif _is_union(ann) and len(rest := [a for a in get_args(ann) if a is not type(None)]) == 1:
            ann = rest[0]
        else:
            return ann


_WANT = {"int_type": "an integer", "float_type": "a number", "string_type": "a string", "bool_type": "a boolean",
         "list_type": "a list", "flag_value_type": "a single value (string, number, true/false, null)"}


def _want(kind: str, ann: object) -> str:
    """What a value of type `ann` must be, after an error of this kind."""
    text = "one of " + ", ".join(map(str, get_args(_bare(ann)))) if kind == "literal_error" else \
        _WANT.get(kind, "a mapping")
    return text + (" or null" if type(None) in get_args(ann) else "")
