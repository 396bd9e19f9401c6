"""Read a YAML file as plain Python values plus the line of every key and value, so campaign errors can
say `file:line:`.

Only the safe YAML subset is used (`yaml.compose` with the SafeLoader, libyaml's when PyYAML has it); scalars
are converted with the safe constructor, so `true`, `12`, `1.5` and `null` mean what they mean in
`yaml.safe_load`. Mapping keys are kept as written (strings); a repeated key is a problem (the first one counts).

A campaign file is input like any other, so the work it can ask for is bounded where it is read: at most
`MAX_BYTES`, nesting at most `MAX_DEPTH` deep (counted on the parser's events, before a node is built: a
100,000-deep `[` never reaches the recursive composer), and at most `MAX_VALUES` values once aliases are
expanded (a billion laughs, or `name: &x [*x]`, which refers to itself, is refused in one line)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from harness.errors import UserError
from harness.formats.folder_guard import NotOurs, read_capped

MAX_BYTES = 8 * 2**20  # a campaign file (the largest shipped is 6 KB)
MAX_DEPTH = 32  # mappings and lists inside each other (a campaign needs 5)
MAX_VALUES = 500_000  # values once aliases are expanded (30,000 fleet targets make 120,000)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: 4x faster on a long file
Loc = tuple[str | int, ...]  # keys and list indices from the top of the document
Where = int | str  # a line of the file, or the command-line argument a value came from (`--set k=v`)


def place(src: str, where: Where) -> str:
    """Where a problem is, as messages start: `file:line` or the `--set` argument."""
    return where if isinstance(where, str) else f"{src}:{where}"


def where_order(where: Where) -> tuple[int, int]:
    """Sort key: the file's lines in order, then the command-line arguments (in the order given)."""
    return (1, 0) if isinstance(where, str) else (0, where)


class CampaignError(UserError):
    """One or more campaign problems. str() is the first one (one line); `.lines` holds all of them."""

    def __init__(self, lines: list[str]):
        self.lines = lines
        more = f" (and {len(lines) - 1} more: run `bmoe-bench validate` to list them)" if len(lines) > 1 else ""
        super().__init__(lines[0] + more)

    @classmethod
    def at(cls, src: str, problems: list[tuple[Where, str]]) -> CampaignError:
        """From (where, message) pairs: the file's in line order, then the command line's."""
        return cls([f"{place(src, w)}: {msg}" for w, msg in sorted(problems, key=lambda t: where_order(t[0]))])


@dataclass
class Document:
    """A YAML file's content as plain values, and where each part of it is (a line, or the `--set`
    argument that replaced it)."""

    data: object = None
    value_lines: dict[Loc, Where] = field(default_factory=dict)
    key_lines: dict[Loc, Where] = field(default_factory=dict)  # the line of the key of a mapping entry
    texts: dict[Loc, str] = field(default_factory=dict)  # scalars as written
    problems: list[tuple[Where, str]] = field(default_factory=list)  # (where, message)
    replaced: list[tuple[Loc, str]] = field(default_factory=list)  # (location, `--set` argument), in order

    def line(self, loc: Loc, *, key: bool = False) -> Where:
        """The line of `loc` (its key's line with key=True), else of the nearest part that exists."""
        if key and loc in self.key_lines:
            return self.key_lines[loc]
        while loc not in self.value_lines:
            loc = loc[:-1]
        return self.value_lines[loc]

    def top(self, key: str) -> Where:
        """Where a top-level key's value comes from: the last `--set` under it, else its line."""
        return next((w for loc, w in reversed(self.replaced) if loc[0] == key), None) or self.line((key,))


def read_document(path: Path, shown: str) -> Document:
    doc = Document()
    try:
        text = read_capped(path, MAX_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise UserError(f"{shown}: no such campaign file") from None
    except OSError as e:
        raise UserError(f"{shown}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{shown}: not UTF-8 (byte {e.start})") from None
    except NotOurs:
        raise UserError(f"{shown}: larger than {MAX_BYTES // 2**20} MiB; a campaign file is a few KB") from None
    try:
        node = compose(text)
        if node is None:
            raise CampaignError([f"{shown}:1: empty campaign file"])
        doc.data = convert(node, doc)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 1
        raise CampaignError([f"{shown}:{line}: YAML syntax: {e.problem or e.context}"]) from None
    except TooLarge as e:
        raise CampaignError([f"{shown}:{e.line}: {e}"]) from None
    return doc


class TooLarge(ValueError):
    """YAML nested too deep or expanding to too many values: one line, `line` where it was found."""

    def __init__(self, msg: str, line: int):
        super().__init__(msg)
        self.line = line


def compose(text: str) -> yaml.Node | None:
    """The node tree of one YAML document, its nesting checked on the parser's events first (TooLarge)."""
    depth = 0
    for ev in yaml.parse(text, Loader=_LOADER):
        if isinstance(ev, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise TooLarge(f"nested deeper than {MAX_DEPTH} levels; a campaign needs a few", ev.start_mark.line + 1)
        elif isinstance(ev, yaml.CollectionEndEvent):
            depth -= 1
    return yaml.compose(text, Loader=_LOADER)


_CONSTRUCTOR = yaml.SafeLoader("")  # only used for construct_object on scalar nodes


def convert(node: yaml.Node, doc: Document) -> object:
    """Plain values of a node tree, their places noted in doc; TooLarge past MAX_DEPTH or MAX_VALUES (aliases)."""
    return _convert(node, (), doc, [MAX_VALUES])


def _convert(node: yaml.Node, loc: Loc, doc: Document, left: list[int]) -> object:
    left[0] -= 1
    if left[0] < 0 or len(loc) > MAX_DEPTH:
        what = f"more than {MAX_VALUES} values" if left[0] < 0 else f"values nested deeper than {MAX_DEPTH} levels"
        raise TooLarge(f"aliases (*name) expand to {what}; write the values out",
                       node.start_mark.line + 1)
    doc.value_lines[loc] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[str, object] = {}
        for knode, vnode in node.value:
            line = knode.start_mark.line + 1
            if not isinstance(knode, yaml.ScalarNode):
                doc.problems.append((line, f"{loc_name(loc)}: keys must be strings"))
            elif knode.value in out:
                doc.problems.append((line, f"duplicate key {knode.value!r} in {loc_name(loc)}"))
            else:
                doc.key_lines[loc + (knode.value,)] = line
                out[knode.value] = _convert(vnode, loc + (knode.value,), doc, left)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_convert(v, loc + (i,), doc, left) for i, v in enumerate(node.value)]
    doc.texts[loc] = node.value
    return _CONSTRUCTOR.construct_object(node, deep=True)


def loc_name(loc: Loc) -> str:
    """A location as messages name it: `target.kind`, `axes[0].values`, `flags --cache-mb`."""
    if not loc:
        return "the campaign"
    out = str(loc[0])
    for part in loc[1:]:
        out += f"[{part}]" if isinstance(part, int) else f" {part}" if part.startswith("-") else f".{part}"
    return out


def type_name(v: object) -> str:
    if isinstance(v, dict):
        return "a mapping"
    if isinstance(v, list):
        return "a list"
    if v is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(type(v), type(v).__name__)
