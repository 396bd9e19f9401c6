"""Read a YAML file as a node tree that remembers line numbers, so campaign errors can say `file:line:`.

Only the safe YAML subset is used (`yaml.compose` with the SafeLoader); values are converted with the
safe constructor, so `true`, `12`, `1.5` and `null` mean what they mean in `yaml.safe_load`."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from harness.errors import UserError


@dataclass
class Problems:
    """Validation problems, each `file:line: message`, collected so `validate` can list them all."""

    src: str
    items: list[tuple[int, str]] = field(default_factory=list)

    def add(self, node: yaml.Node | None, msg: str) -> None:
        line = node.start_mark.line + 1 if node is not None else 1
        self.items.append((line, msg))

    def lines(self) -> list[str]:
        return [f"{self.src}:{line}: {msg}" for line, msg in sorted(self.items, key=lambda t: t[0])]

    def raise_if_any(self) -> None:
        if self.items:
            raise CampaignError(self.lines())


class CampaignError(UserError):
    """One or more campaign problems. str() is the first one (one line); `.lines` holds all of them."""

    def __init__(self, lines: list[str]):
        self.lines = lines
        more = f" (and {len(lines) - 1} more: run `bmoe-bench validate` to list them)" if len(lines) > 1 else ""
        super().__init__(lines[0] + more)


def compose_file(path: Path, shown: str) -> yaml.Node:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{shown}: no such campaign file") from None
    except OSError as e:
        raise UserError(f"{shown}: cannot read: {e.strerror}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 1
        raise CampaignError([f"{shown}:{line}: YAML syntax: {e.problem or e.context}"]) from None
    if node is None:
        raise CampaignError([f"{shown}:1: empty campaign file"])
    return node


_CONSTRUCTOR = yaml.SafeLoader("")  # only used for construct_object on scalar nodes


def scalar(node: yaml.ScalarNode) -> object:
    return _CONSTRUCTOR.construct_object(node, deep=True)


def plain(node: yaml.Node) -> object:
    """Whole subtree as Python values."""
    if isinstance(node, yaml.MappingNode):
        return {plain(k): plain(v) for k, v in node.value}
    if isinstance(node, yaml.SequenceNode):
        return [plain(v) for v in node.value]
    return scalar(node)


def type_name(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    v = scalar(node)
    if v is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(type(v), type(v).__name__)


def mapping_items(node: yaml.Node, allowed: dict[str, str], where: str, probs: Problems
                  ) -> dict[str, yaml.Node] | None:
    """Keys of a mapping node -> value nodes. Unknown and duplicate keys are problems. `allowed` maps
    key -> one-line description (used for suggestions)."""
    if not isinstance(node, yaml.MappingNode):
        probs.add(node, f"{where} must be a mapping, got {type_name(node)}")
        return None
    out: dict[str, yaml.Node] = {}
    for knode, vnode in node.value:
        key = scalar(knode) if isinstance(knode, yaml.ScalarNode) else None
        if not isinstance(key, str):
            probs.add(knode, f"{where}: keys must be strings")
            continue
        if key in out:
            probs.add(knode, f"duplicate key {key!r} in {where}")
            continue
        if key not in allowed:
            close = difflib.get_close_matches(key, list(allowed), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (known keys: {', '.join(allowed)})"
            at = "" if where == "the campaign" else f" in {where}"
            probs.add(knode, f"unknown key {key!r}{at}{hint}")
            continue
        out[key] = vnode
    return out


def key_node(mapping: yaml.MappingNode, key: str) -> yaml.Node | None:
    for knode, _ in mapping.value:
        if isinstance(knode, yaml.ScalarNode) and knode.value == key:
            return knode
    return None
