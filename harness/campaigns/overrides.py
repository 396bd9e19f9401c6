"""`--set KEY=VALUE`: a campaign field overridden from the command line, applied to the file's document
before validation, so it is checked by the same models and its problems name the argument.

KEY is a dotted path of keys from the top of the file (`tokens`, `model.path`, `target.serial`,
`cooldown.max_wait_s`); a part that starts with `-` is an engine flag and takes the rest of the key
(`flags.--cache-mb`); a number indexes a list that has that entry (`axes.0.values`). Missing mappings
on the way are created. VALUE is one YAML scalar, as it would be written in the file (`8`, `true`,
`null` or nothing, `1.5`, any other text as it is); a value starting with `[`, `{` or a quote is read as
YAML (`[0, 512]`, `{shape: tiny}`, `'8'` for the string). Setting one of a part's exclusive keys replaces
the others (`model.path` drops the file's `model.recipe`). Later arguments win."""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from harness.campaigns.yamlsrc import MAX_DEPTH, Document, Loc, TooLarge, compose, convert, loc_name, type_name
from harness.formats.campaign import ONE_OF, SHORTHAND

EXAMPLE = "e.g. --set target.serial=R5CT1234 or --set 'flags.--cache-mb=0'"
_YAML = yaml.SafeLoader("")  # resolves and constructs a plain scalar as the file's reader does


@dataclass(frozen=True)
class Override:
    arg: str  # as given, without `--set`
    keys: tuple[str, ...]
    value: object
    text: str | None  # the value as written, when it is a scalar

    @property
    def where(self) -> str:
        return set_where(self.arg)


def set_where(arg: str) -> str:
    """`--set ARG` as a message names it: at most 80 characters of the argument (a hostile one may be megabytes)."""
    return f"--set {arg if len(arg) <= 80 else arg[:76] + '...'}"


def parse_override(arg: str) -> Override | str:
    """An argument of `--set`, or what is wrong with it (one line, to follow `--set ARG: `)."""
    key, eq, text = arg.partition("=")
    key = key.strip()
    if not eq or not key:
        return f"needs KEY=VALUE ({EXAMPLE})"
    keys: list[str] = []
    rest = key
    while rest:
        if rest.startswith("-"):  # an engine flag: no dots in it, takes the rest
            keys.append(rest)
            break
        part, _, rest = rest.partition(".")
        keys.append(part)
        if len(keys) > MAX_DEPTH:
            return f"the key has more than {MAX_DEPTH} dotted parts; a campaign's keys are a few deep (model.path)"
    if any(not k for k in keys):
        return f"{key!r} has an empty part; write keys joined by single dots, e.g. model.path"
    try:
        value = parse_value(text)
    except yaml.YAMLError as e:
        return f"the value is not YAML ({getattr(e, 'problem', None) or e})"
    except TooLarge as e:
        return f"the value: {e}"
    return Override(arg=arg, keys=tuple(keys), value=value,
                    text=None if isinstance(value, dict | list) else text.strip())


def parse_value(text: str) -> object:
    """A `--set` value: one YAML scalar as the file's reader would construct it, or YAML when it starts
    with a bracket or a quote."""
    s = text.strip()
    if s[:1] in ("[", "{", "'", '"'):  # bounded as the file is (harness.campaigns.yamlsrc)
        node = compose(s)
        return None if node is None else convert(node, Document())
    tag = _YAML.resolve(yaml.ScalarNode, s, (True, False))
    return _YAML.construct_object(yaml.ScalarNode(tag, s), deep=True)


def apply_overrides(doc: Document, args: list[str] | tuple[str, ...]) -> None:
    """Apply each `--set` argument to the document in order; a problem goes to doc.problems."""
    for arg in args:
        ov = parse_override(arg)
        if isinstance(ov, str):
            doc.problems.append((set_where(arg), ov))
            continue
        problem = _apply(doc, ov)
        if problem:
            doc.problems.append((ov.where, problem))


def _apply(doc: Document, ov: Override) -> str | None:
    node = doc.data
    if not isinstance(node, dict):
        return "the campaign file is not a mapping of keys"
    loc: Loc = ()
    for i, part in enumerate(ov.keys):
        if isinstance(node, list) and not (part.isdigit() and int(part) < len(node)):
            n, whole = len(node), f"set it whole (--set {'.'.join(ov.keys[:i])}=[...])"
            return (f"{loc_name(loc)} has {n} entr{'y' if n == 1 else 'ies'}: "
                    + (f"index it with 0..{n - 1}, or {whole}" if n else whole))
        idx: str | int = int(part) if isinstance(node, list) else part
        if i == len(ov.keys) - 1:
            _set(doc, node, idx, loc, ov)
            return None
        child = node[idx] if isinstance(node, list) else node.get(idx)
        if child is None:  # missing (or null): created on the way
            child = node[idx] = {}  # type: ignore[index]
            doc.value_lines.setdefault(loc + (idx,), ov.where)
        elif isinstance(child, str) and loc == () and idx in SHORTHAND:  # `target: adb` -> {kind: adb}
            child = node[idx] = {"kind": child}
        elif not isinstance(child, dict | list):
            return (f"{loc_name(loc + (idx,))} is {type_name(child)} in the file, not a mapping: set it whole "
                    f"(--set {'.'.join(ov.keys[:i + 1])}=...)")
        node, loc = child, loc + (idx,)
    return None


def _set(doc: Document, node: dict | list, idx: str | int, parent: Loc, ov: Override) -> None:
    loc = parent + (idx,)
    if len(loc) == 2 and isinstance(node, dict) and idx in ONE_OF.get(str(loc[0]), ()):
        for other in ONE_OF[str(loc[0])]:
            if other != idx and other in node:
                del node[other]
                _forget(doc, parent + (other,))
    node[idx] = ov.value  # type: ignore[index]
    _forget(doc, loc)
    doc.value_lines[loc] = doc.key_lines[loc] = ov.where
    if ov.text is not None:
        doc.texts[loc] = ov.text
    doc.replaced.append((loc, ov.where))


def _forget(doc: Document, loc: Loc) -> None:
    """Drop what the file said about `loc` and everything under it."""
    for table in (doc.value_lines, doc.key_lines, doc.texts):
        for k in [k for k in table if k[:len(loc)] == loc]:
            del table[k]
